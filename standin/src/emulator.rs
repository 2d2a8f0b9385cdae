//! Kernels: every family of kernels/cuda, built for the host with the SIMT emulator when
//! this crate is built (build.rs), loaded on first use, and launched as cuLaunchKernel
//! launches: the grid and block as given, each parameter read from the array of pointers
//! to values CUDA passes, with the sizes the kernel's C++ declaration gives.

use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr, CString};
use std::sync::atomic::AtomicI32;
use std::sync::{Mutex, OnceLock};

include!(concat!(env!("OUT_DIR"), "/families.rs"));

type Count = unsafe extern "C" fn() -> c_uint;
type Name = unsafe extern "C" fn(c_uint) -> *const c_char;
type Params = unsafe extern "C" fn(c_uint, *mut c_ulonglong, c_uint) -> c_uint;
type Launch =
    unsafe extern "C" fn(c_uint, *const c_uint, *const c_uint, c_uint, c_ulonglong, *mut *mut c_void);

/// A kernel the emulator can run.
pub struct Kernel {
    pub name: String,
    /// The byte size of each parameter, in order.
    pub param_sizes: Vec<usize>,
    /// The most dynamic shared memory a launch may give it, its
    /// MAX_DYNAMIC_SHARED_SIZE_BYTES: 48 KB until raised (on a GPU, 48 KB less its static
    /// shared memory, which the stand-in does not know). One for the process, as the kernel
    /// is, where a GPU keeps one a loaded module.
    pub max_dynamic_shared: AtomicI32,
    index: c_uint,
    launch: Launch,
}

/// The emulator keeps one block's threads in globals: one launch at a time in the process.
static RUNNING: Mutex<()> = Mutex::new(());

impl Kernel {
    /// Runs the kernel over `grid` blocks of `block` threads with `shared` bytes of dynamic
    /// shared memory, its block and warp orders shuffled by `seed`. `params[i]` points to
    /// parameter i's value.
    ///
    /// # Safety
    /// `params` holds one pointer per parameter, each to a value of the parameter's size,
    /// and every device pointer among the values points to memory the kernel may access.
    pub unsafe fn launch(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        seed: u64,
        params: &mut [*mut c_void],
    ) {
        assert_eq!(params.len(), self.param_sizes.len(), "{}: parameters", self.name);
        let _running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: per the contract; the family's entry reads exactly its parameters.
        unsafe { (self.launch)(self.index, grid.as_ptr(), block.as_ptr(), shared, seed, params.as_mut_ptr()) }
    }
}

/// Every kernel of every family, by name; or why there are none.
pub fn kernels() -> Result<&'static HashMap<String, Kernel>, String> {
    static KERNELS: OnceLock<Result<HashMap<String, Kernel>, String>> = OnceLock::new();
    KERNELS.get_or_init(load_all).as_ref().map_err(Clone::clone)
}

fn load_all() -> Result<HashMap<String, Kernel>, String> {
    if let Some(why) = UNAVAILABLE {
        return Err(format!("the stand-in was built without its kernels: {why}"));
    }
    let mut all = HashMap::new();
    for (file, names, object) in FAMILIES {
        for kernel in load_family(file, object)? {
            if !names.contains(&kernel.name.as_str()) {
                return Err(format!("{file}: kernel {} was not declared", kernel.name));
            }
            all.insert(kernel.name.clone(), kernel);
        }
    }
    Ok(all)
}

/// Loads one family's shared object from memory (a memfd: no file is left behind).
fn load_family(file: &str, object: &[u8]) -> Result<Vec<Kernel>, String> {
    let fail = |what: &str| format!("cannot load the emulated {file}: {what}");
    let name = CString::new(file).expect("a file name");
    // SAFETY: a new anonymous file; written whole, then opened by its /proc path.
    let handle = unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(fail("memfd_create failed"));
        }
        let written = libc::write(fd, object.as_ptr().cast(), object.len());
        if written != object.len() as isize {
            libc::close(fd);
            return Err(fail("writing it failed"));
        }
        let path = CString::new(format!("/proc/self/fd/{fd}")).expect("a path");
        // The file stays open: the loader knows a library by its path, and a closed fd's
        // number, reused for the next family, would name this one again.
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            return Err(fail(&CStr::from_ptr(libc::dlerror()).to_string_lossy()));
        }
        handle
    };
    let symbol = |s: &CStr| {
        // SAFETY: a symbol of a loaded library, by a NUL-terminated name.
        let f = unsafe { libc::dlsym(handle, s.as_ptr()) };
        if f.is_null() {
            Err(fail(&format!("no symbol {s:?}")))
        } else {
            Ok(f)
        }
    };
    // SAFETY: simt.hpp's SIMT_LIBRARY defines these with exactly these signatures.
    let (count, name_of, params_of, launch) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Count>(symbol(c"simt_kernel_count")?),
            std::mem::transmute::<*mut c_void, Name>(symbol(c"simt_kernel_name")?),
            std::mem::transmute::<*mut c_void, Params>(symbol(c"simt_kernel_params")?),
            std::mem::transmute::<*mut c_void, Launch>(symbol(c"simt_kernel_launch")?),
        )
    };
    let mut kernels = Vec::new();
    // SAFETY: indices below the family's count; names are static strings of the library.
    unsafe {
        for index in 0..count() {
            let name = CStr::from_ptr(name_of(index)).to_string_lossy().into_owned();
            let mut sizes = [0u64; 64];
            let n = params_of(index, sizes.as_mut_ptr(), sizes.len() as c_uint) as usize;
            assert!(n <= sizes.len(), "{name}: more than {} parameters", sizes.len());
            kernels.push(Kernel {
                name,
                param_sizes: sizes[..n].iter().map(|&s| s as usize).collect(),
                max_dynamic_shared: AtomicI32::new(crate::devices::SHARED_PER_BLOCK),
                index,
                launch,
            });
        }
    }
    Ok(kernels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_loads_and_adamw_has_its_declared_parameters() {
        if let Some(why) = UNAVAILABLE {
            eprintln!("SKIP every_family_loads_and_adamw_has_its_declared_parameters: {why}");
            return;
        }
        let kernels = kernels().expect("the families load");
        // adamw(const AdamWTensor*, const unsigned long long* first, int count, then 7 floats)
        assert_eq!(kernels["adamw"].param_sizes, [8, 8, 4, 4, 4, 4, 4, 4, 4, 4]);
        let declared: usize = FAMILIES.iter().map(|(_, names, _)| names.len()).sum();
        assert_eq!(kernels.len(), declared);
    }

    #[test]
    fn a_launch_runs_the_kernel_on_host_memory() {
        if UNAVAILABLE.is_some() {
            eprintln!("SKIP a_launch_runs_the_kernel_on_host_memory: no emulated kernels");
            return;
        }
        let add = &kernels().expect("the families load")["add"];
        // add(float* out, const float* a, const float* b, unsigned long long n), if declared so.
        assert_eq!(add.param_sizes, [8, 8, 8, 8]);
        let n = 300usize;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
        let mut out = vec![0f32; n];
        let (mut po, mut pa, mut pb, mut pn) = (out.as_mut_ptr(), a.as_ptr(), b.as_ptr(), n as u64);
        let mut params: Vec<*mut c_void> = vec![
            (&mut po as *mut *mut f32).cast(),
            (&mut pa as *mut *const f32).cast(),
            (&mut pb as *mut *const f32).cast(),
            (&mut pn as *mut u64).cast(),
        ];
        // SAFETY: four parameters of the sizes checked above; the buffers hold n floats.
        unsafe { add.launch([2, 1, 1], [256, 1, 1], 0, 1, &mut params) };
        assert!(out.iter().enumerate().all(|(i, &o)| o == 1.5 * i as f32));
    }
}
