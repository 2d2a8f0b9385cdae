//! The unique id: a magic and a random key, which names the hub's socket in the abstract
//! Unix namespace (per network namespace: ranks must share one, as they share a machine).

use cudarc::nccl::sys::ncclUniqueId;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;

const MAGIC: &[u8; 8] = b"PTSINCCL";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key([u8; 16]);

impl Key {
    pub fn random() -> io::Result<Key> {
        let mut key = [0u8; 16];
        // SAFETY: getrandom writes at most `key.len()` bytes into `key`.
        let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
        if n != key.len() as isize {
            return Err(io::Error::last_os_error());
        }
        Ok(Key(key))
    }

    pub fn to_id(self) -> ncclUniqueId {
        let mut internal = [0 as std::ffi::c_char; 128];
        for (slot, byte) in internal.iter_mut().zip(MAGIC.iter().chain(&self.0)) {
            *slot = *byte as std::ffi::c_char;
        }
        ncclUniqueId { internal }
    }

    /// The key an id carries; None for bytes no `ncclGetUniqueId` of this library made.
    pub fn from_id(id: &ncclUniqueId) -> Option<Key> {
        let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        (bytes[..8] == MAGIC[..]).then(|| Key(bytes[8..24].try_into().expect("16 bytes")))
    }

    pub fn address(self) -> SocketAddr {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        SocketAddr::from_abstract_name(format!("pipetrain-standin-nccl-{hex}"))
            .expect("an abstract name well under the 107-byte limit")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_carries_its_key_and_foreign_bytes_are_refused() {
        let key = Key::random().unwrap();
        assert_eq!(Key::from_id(&key.to_id()), Some(key));
        assert_ne!(Key::random().unwrap(), key);
        assert_eq!(Key::from_id(&ncclUniqueId { internal: [0; 128] }), None);
    }
}
