//! Device memory: a stand-in GPU's address is a host address, so kernels, copies, GEMMs and
//! collectives read and write it directly. Each allocation ends at an unmapped page, so a
//! read or write past its end faults; each GPU has the capacity the environment gives it,
//! so running out of memory is testable. Fresh memory is poisoned (all ones bits: NaN in
//! f32 and bf16), as CUDA promises no contents, so a kernel that leaves an element of its
//! output unwritten shows as NaN rather than as the zero a fresh page would hold; freed
//! memory is poisoned too and kept mapped a while, so a use after free reads NaN rather
//! than stale values that look right.

use crate::devices::capacity;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

/// A mapping: `len` usable bytes at `addr`, ending where an unmapped page begins.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    base: usize,
    span: usize,
    addr: usize,
    len: usize,
    device: usize,
}

/// Freed bytes kept poisoned (and mapped) before they are unmapped, oldest first.
const QUARANTINE_BYTES: usize = 256 << 20;

#[derive(Default)]
struct Memory {
    live: BTreeMap<usize, Mapping>,
    /// Bytes allocated on each GPU, by ordinal.
    used: BTreeMap<usize, usize>,
    quarantine: VecDeque<Mapping>,
    quarantined: usize,
    /// Page-locked host allocations (cuMemHostAlloc): copies to and from them are
    /// asynchronous, as CUDA's are.
    pinned: BTreeMap<usize, usize>,
}

static MEMORY: Mutex<Memory> = Mutex::new(Memory {
    live: BTreeMap::new(),
    used: BTreeMap::new(),
    quarantine: VecDeque::new(),
    quarantined: 0,
    pinned: BTreeMap::new(),
});

fn memory() -> MutexGuard<'static, Memory> {
    MEMORY.lock().unwrap_or_else(|e| e.into_inner())
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// `len` bytes (at least one) that end at an unmapped page, 256-byte aligned as
/// cudaMalloc's are when `len` is a multiple of 256.
fn map(len: usize, device: usize) -> Option<Mapping> {
    let page = page();
    let used = len.max(1).next_multiple_of(256);
    let span = used.next_multiple_of(page);
    // SAFETY: a fresh anonymous mapping; the page past it is made inaccessible.
    unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            span + page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as usize;
        if libc::mprotect((base + span) as *mut libc::c_void, page, libc::PROT_NONE) != 0 {
            libc::munmap(base as *mut libc::c_void, span + page);
            return None;
        }
        Some(Mapping { base, span: span + page, addr: base + span - used, len, device })
    }
}

fn unmap(m: Mapping) {
    // SAFETY: the mapping was made by `map` and nothing refers to it any more.
    unsafe { libc::munmap(m.base as *mut libc::c_void, m.span) };
}

/// Sets every usable byte of `m` to all ones: NaN in f32 and bf16.
fn poison(m: &Mapping) {
    // SAFETY: a mapping's `len` bytes at `addr` stay mapped and writable until `unmap`, which
    // only a mapping out of the live set and the quarantine reaches.
    unsafe { std::ptr::write_bytes(m.addr as *mut u8, 0xff, m.len) };
}

/// Allocates `len` bytes on GPU `device`, poisoned; None when they would pass its capacity.
pub fn allocate(device: usize, len: usize) -> Option<u64> {
    let mut mem = memory();
    let used = mem.used.get(&device).copied().unwrap_or(0);
    if used + len > capacity(device) {
        return None;
    }
    let mapping = map(len, device)?;
    poison(&mapping);
    *mem.used.entry(device).or_default() += len;
    mem.live.insert(mapping.addr, mapping);
    Some(mapping.addr as u64)
}

/// Frees the allocation at `addr`: its bytes are poisoned and leave the GPU's count. False
/// if `addr` is not the start of a live allocation.
pub fn free(addr: u64) -> bool {
    let mut mem = memory();
    let Some(m) = mem.live.remove(&(addr as usize)) else { return false };
    poison(&m);
    *mem.used.entry(m.device).or_default() -= m.len;
    mem.quarantined += m.span;
    mem.quarantine.push_back(m);
    while mem.quarantined > QUARANTINE_BYTES {
        let Some(old) = mem.quarantine.pop_front() else { break };
        mem.quarantined -= old.span;
        unmap(old);
    }
    true
}

/// Bytes allocated on GPU `device` now.
pub fn used(device: usize) -> usize {
    memory().used.get(&device).copied().unwrap_or(0)
}

/// The GPU of the live allocation holding `[addr, addr + len)`, if one does.
pub fn device_of(addr: u64, len: usize) -> Option<usize> {
    let mem = memory();
    let (_, m) = mem.live.range(..=addr as usize).next_back()?;
    (addr as usize + len <= m.addr + m.len).then_some(m.device)
}

/// Page-locked host memory: `len` bytes, asynchronous to copy.
pub fn allocate_pinned(len: usize) -> Option<*mut u8> {
    let mapping = map(len, usize::MAX)?;
    memory().pinned.insert(mapping.addr, len);
    // The mapping stays recorded by its address and length; its base is recomputed on free.
    Some(mapping.addr as *mut u8)
}

pub fn free_pinned(ptr: *mut u8) -> bool {
    let Some(len) = memory().pinned.remove(&(ptr as usize)) else { return false };
    let page = page();
    let used = len.max(1).next_multiple_of(256);
    let span = used.next_multiple_of(page);
    let base = ptr as usize + used - span;
    unmap(Mapping { base, span: span + page, addr: ptr as usize, len, device: usize::MAX });
    true
}

/// Whether `[ptr, ptr + len)` lies in page-locked host memory.
pub fn is_pinned(ptr: *const u8, len: usize) -> bool {
    let mem = memory();
    let Some((&start, &n)) = mem.pinned.range(..=ptr as usize).next_back() else { return false };
    ptr as usize + len <= start + n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_memory_reads_as_nan() {
        let addr = allocate(0, 6).expect("6 bytes");
        // SAFETY: 6 bytes were allocated at addr.
        let (f, h) = unsafe { ((addr as *const f32).read(), (addr as *const u16).add(2).read()) };
        assert!(f.is_nan());
        assert_eq!(h, 0xffff, "a bf16 NaN");
        assert!(free(addr));
    }

    #[test]
    fn freed_memory_reads_as_nan() {
        let addr = allocate(0, 16).expect("16 bytes");
        let p = addr as *mut f32;
        // SAFETY: 16 bytes were allocated at p.
        unsafe { p.write(1.5) };
        assert!(free(addr));
        // SAFETY: freed memory stays mapped (poisoned) while in quarantine.
        assert!(unsafe { p.read() }.is_nan());
        assert!(!free(addr), "a double free is refused");
    }

    #[test]
    fn an_address_inside_an_allocation_finds_its_gpu() {
        let addr = allocate(0, 1000).expect("1000 bytes");
        assert_eq!(device_of(addr + 10, 990), Some(0));
        assert_eq!(device_of(addr + 10, 991), None);
        free(addr);
    }

    #[test]
    fn pinned_memory_is_known_as_pinned() {
        let p = allocate_pinned(4096).expect("a page");
        assert!(is_pinned(p, 4096));
        // SAFETY: only the address is compared.
        assert!(!is_pinned(unsafe { p.add(1) }, 4096));
        assert!(free_pinned(p));
        assert!(!is_pinned(p, 1));
    }
}
