//! One writer per run dir. `train` holds an exclusive `flock` on `RUN/train.lock`, its pid
//! written inside, for as long as it writes the run dir; a second `train` on that dir is
//! refused, naming the pid. The OS releases the lock when the process ends, however it
//! ends, so the lock of a killed run does not block the next one. The file stays: removing
//! it would let a process that opened it just before lock a file no one else sees.

use crate::error::user_error;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

pub const LOCK_FILE: &str = "train.lock";

/// Held for as long as the run writes its dir; dropping it (or the process ending)
/// releases the lock.
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Locks `run_dir` (which exists), or says which process holds it.
    pub fn acquire(run_dir: &Path) -> anyhow::Result<RunLock> {
        let path = run_dir.join(LOCK_FILE);
        let cannot =
            |what: &str, e: std::io::Error| user_error(format!("{}: cannot {what}: {e}", path.display()));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| cannot("open", e))?;
        // SAFETY: flock on a descriptor `file` owns; it takes no pointer.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(cannot("lock", e));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "a process that has not written its pid yet".to_string(),
                pid => format!("pid {pid}"),
            };
            return Err(user_error(format!(
                "{}: another train ({holder}) is writing this run dir; wait for it to end or stop it",
                run_dir.display()
            )));
        }
        (|| {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
            file.sync_all()
        })()
        .map_err(|e| cannot("write", e))?;
        Ok(RunLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    /// flock locks belong to the open file description: a second open in the same process
    /// is refused as another process would be, and a dropped lock frees the dir.
    #[test]
    fn a_second_writer_is_refused_until_the_first_lets_go() {
        let dir = test_dir("run_lock");
        let first = RunLock::acquire(&dir).unwrap();
        let pid = std::process::id();
        assert_eq!(std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(), format!("{pid}\n"));
        let err = RunLock::acquire(&dir).err().unwrap();
        assert!(crate::error::is_user_error(&err));
        assert_eq!(
            err.to_string(),
            format!(
                "{}: another train (pid {pid}) is writing this run dir; wait for it to end or stop it",
                dir.display()
            )
        );
        drop(first);
        let _again = RunLock::acquire(&dir).unwrap();
    }
}
