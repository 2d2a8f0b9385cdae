//! The Rust side of the emulator (simt.hpp): builds one kernel family into a host program
//! with the C++ compiler, feeds it buffers and launches, and compares what comes back.
//!
//! A family is built once per distinct source text (the build is cached under Cargo's
//! target temporary directory, keyed by a hash of everything compiled), so a test may ask
//! for a family with one file edited, e.g. with a barrier removed.

use cudarc::driver::LaunchConfig;
use kernels::cuda::sources::{kernel_name, HEADERS, SOURCES};
use kernels::DType;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

const EMULATOR: &str = include_str!("simt.hpp");
/// The GPU contracts a * b + c into one rounding where the host would not; with
/// contraction off the host rounds as the CPU backend does, so exact ops stay exact.
const CXXFLAGS: [&str; 3] = ["-std=c++17", "-O2", "-ffp-contract=off"];

/// A kernel family compiled for the emulator.
pub struct Family {
    exe: PathBuf,
}

fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// Why the emulator cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if !cfg!(target_arch = "x86_64") {
        return Some("the emulator's context switch is written for x86-64".into());
    }
    match Command::new(compiler()).arg("--version").output() {
        Ok(out) if out.status.success() => None,
        Ok(_) => Some(format!("the C++ compiler ({}) does not run", compiler())),
        Err(e) => Some(format!("no C++ compiler `{}` ({e}); install one or point $CXX at one", compiler())),
    }
}

impl Family {
    /// Family `name` (a file of kernels/cuda), or None having said why the test skips.
    pub fn of(test: &str, name: &str) -> Option<Family> {
        Family::edited(test, name, &[])
    }

    /// Family `name` with some of its files (the source or a header) replaced by
    /// `(file name, text)`.
    pub fn edited(test: &str, name: &str, edits: &[(&str, String)]) -> Option<Family> {
        let source =
            SOURCES.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no kernel family {name}"));
        let text = |file: &str, original: &str| {
            edits.iter().find(|(f, _)| *f == file).map_or(original.to_string(), |(_, t)| t.clone())
        };
        let sources = [(name, source.source)].into_iter().chain(HEADERS.iter().copied());
        let files = sources.map(|(file, original)| (file.to_string(), text(file, original))).collect();
        Family::build(test, files, name, source.kernels)
    }

    /// A program of kernels that are not in kernels/cuda (a probe of a header); `code`
    /// may include the headers.
    pub fn custom(test: &str, code: &str, kernels: &[&str]) -> Option<Family> {
        let sources = [("custom.cu", code)].into_iter().chain(HEADERS.iter().copied());
        let files = sources.map(|(file, text)| (file.to_string(), text.to_string())).collect();
        Family::build(test, files, "custom.cu", kernels)
    }

    /// Compiles `files` (kernel sources and headers) with the emulator into a program that
    /// serves the `kernels` of `main_file`.
    fn build(
        test: &str,
        mut files: Vec<(String, String)>,
        main_file: &str,
        kernels: &[&str],
    ) -> Option<Family> {
        if let Some(why) = unavailable() {
            eprintln!("SKIP {test}: {why}");
            return None;
        }
        let table: String =
            kernels.iter().map(|k| format!("    {{\"{k}\", simt::launch_entry<{k}>}},\n")).collect();
        let main = format!(
            "#include \"simt.hpp\"\n#include \"{main_file}\"\n\nstatic const simt::Kernel kernels[] = {{\n{table}}};\n\
             int main() {{ return simt::serve(kernels, sizeof kernels / sizeof kernels[0]); }}\n"
        );
        files.push(("simt.hpp".into(), EMULATOR.into()));
        files.push(("main.cpp".into(), main));
        let mut hasher = DefaultHasher::new();
        (&files, CXXFLAGS, compiler()).hash(&mut hasher);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("simt-{:016x}", hasher.finish()));
        let exe = dir.join("kernels");
        if exe.exists() {
            return Some(Family { exe });
        }
        // Built beside, then renamed: tests that build the same family at once all succeed.
        let staging = dir.with_extension(format!("{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&staging).expect("a build directory");
        for (file, text) in &files {
            std::fs::write(staging.join(file), text).expect("write a source file");
        }
        let out = Command::new(compiler())
            .args(CXXFLAGS)
            .arg("-o")
            .arg(staging.join("kernels"))
            .arg(staging.join("main.cpp"))
            .output()
            .expect("run the C++ compiler");
        assert!(
            out.status.success(),
            "{test}: the emulator does not compile:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::fs::rename(&staging, &dir).is_err() {
            std::fs::remove_dir_all(&staging).ok(); // another test got there first
        }
        Some(Family { exe })
    }

    /// Runs the buffers and launches of `run`; the buffers it reads, or the emulator's
    /// message (a fault, a deadlock, a barrier not every thread reaches).
    pub fn run(&self, run: Run) -> Result<Outputs, String> {
        let mut child = Command::new(&self.exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the emulator");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = run.input;
        // Written from another thread: the program's output may fill its pipe first.
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let mut stdout = Vec::new();
        child.stdout.take().expect("stdout").read_to_end(&mut stdout).expect("read the emulator's output");
        let out = child.wait_with_output().expect("the emulator ends");
        let written = writer.join().expect("the writer thread");
        if !out.status.success() {
            return Err(format!(
                "the emulator failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            ));
        }
        written.expect("write the emulator's input");
        let mut outputs = Vec::new();
        let mut at = 0;
        for (buf, len) in run.reads {
            outputs.push((buf, stdout[at..at + len].to_vec()));
            at += len;
        }
        assert_eq!(at, stdout.len(), "the emulator wrote more than was read");
        Ok(Outputs(outputs))
    }
}

/// A buffer of a [`Run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf(u32);

/// An element type of a buffer.
pub trait Elem: Copy {
    const BYTES: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const BYTES: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("one element"))
            }
        }
    )*};
}
elem!(f32, f64, u32, u16, u8, i32, u64);

/// A kernel argument: a buffer, a null pointer, or a value's bytes.
#[derive(Clone)]
pub enum Arg {
    Buf(Buf),
    Null,
    Value(Vec<u8>),
}

impl From<Buf> for Arg {
    fn from(b: Buf) -> Arg {
        Arg::Buf(b)
    }
}

macro_rules! value_arg {
    ($($t:ty),*) => {$(
        impl From<$t> for Arg {
            fn from(x: $t) -> Arg {
                let mut bytes = Vec::new();
                x.put(&mut bytes);
                Arg::Value(bytes)
            }
        }
    )*};
}
value_arg!(f32, u32, i32, u64);

/// A word of a [`Run::table`]: the address of a buffer's byte `offset`, a null pointer, or a
/// value.
#[derive(Clone, Copy)]
pub enum Word {
    At(Buf, u64),
    Null,
    Value(u64),
}

/// The buffers, launches and reads of one emulator run, in order.
pub struct Run {
    input: Vec<u8>,
    buffers: Vec<usize>,
    reads: Vec<(Buf, usize)>,
    seed: u64,
}

impl Run {
    /// `seed` orders the blocks, warps and lanes of every launch (each launch its own).
    pub fn new(seed: u64) -> Run {
        Run { input: Vec::new(), buffers: Vec::new(), reads: Vec::new(), seed }
    }

    pub fn buffer<T: Elem>(&mut self, data: &[T]) -> Buf {
        let id = self.buffers.len() as u32;
        self.input.push(b'b');
        self.input.extend_from_slice(&id.to_le_bytes());
        self.input.extend_from_slice(&((data.len() * T::BYTES) as u64).to_le_bytes());
        self.input.reserve(data.len() * T::BYTES);
        for &x in data {
            x.put(&mut self.input);
        }
        self.buffers.push(data.len() * T::BYTES);
        Buf(id)
    }

    /// A buffer of 64-bit words, as a table of records that hold device pointers is laid out.
    pub fn table(&mut self, words: &[Word]) -> Buf {
        let id = self.buffers.len() as u32;
        self.input.push(b't');
        self.input.extend_from_slice(&id.to_le_bytes());
        self.input.extend_from_slice(&(words.len() as u32).to_le_bytes());
        for word in words {
            match *word {
                Word::At(b, offset) => {
                    self.input.push(b'p');
                    self.input.extend_from_slice(&b.0.to_le_bytes());
                    self.input.extend_from_slice(&offset.to_le_bytes());
                }
                Word::Null => self.input.push(b'n'),
                Word::Value(x) => {
                    self.input.push(b'v');
                    self.input.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        self.buffers.push(words.len() * 8);
        Buf(id)
    }

    pub fn launch(&mut self, kernel: &str, cfg: LaunchConfig, args: &[Arg]) {
        self.launch_blocks(kernel, cfg, args, &[]);
    }

    /// A launch of the whole grid that runs only `blocks` (linear ids, x fastest; all of
    /// them if empty): the real dimensions, at the cost of a few blocks.
    pub fn launch_blocks(&mut self, kernel: &str, cfg: LaunchConfig, args: &[Arg], blocks: &[u64]) {
        let mut encoded = Vec::new();
        for arg in args {
            match arg {
                Arg::Buf(b) => {
                    encoded.push(b'p');
                    encoded.extend_from_slice(&b.0.to_le_bytes());
                }
                Arg::Null => encoded.push(b'n'),
                Arg::Value(bytes) => {
                    encoded.push(b's');
                    encoded.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    encoded.extend_from_slice(bytes);
                }
            }
        }
        self.input.push(b'l');
        self.input.extend_from_slice(&(kernel.len() as u32).to_le_bytes());
        self.input.extend_from_slice(kernel.as_bytes());
        let (g, b) = (cfg.grid_dim, cfg.block_dim);
        for d in [g.0, g.1, g.2, b.0, b.1, b.2, cfg.shared_mem_bytes] {
            self.input.extend_from_slice(&d.to_le_bytes());
        }
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.input.extend_from_slice(&self.seed.to_le_bytes());
        self.input.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
        blocks.iter().for_each(|b| self.input.extend_from_slice(&b.to_le_bytes()));
        self.input.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
        self.input.extend_from_slice(&encoded);
    }

    /// Asks for the buffer's contents as they are at this point of the run.
    pub fn read(&mut self, buf: Buf) {
        self.input.push(b'r');
        self.input.extend_from_slice(&buf.0.to_le_bytes());
        self.reads.push((buf, self.buffers[buf.0 as usize]));
    }
}

/// The buffers a run read, in the order of its reads.
pub struct Outputs(Vec<(Buf, Vec<u8>)>);

impl Outputs {
    /// The last read of `buf`.
    pub fn get<T: Elem>(&self, buf: Buf) -> Vec<T> {
        let (_, bytes) = self.0.iter().rev().find(|(b, _)| *b == buf).expect("a buffer the run read");
        bytes.chunks_exact(T::BYTES).map(T::get).collect()
    }
}

/// Equal bit for bit (NaNs included).
pub fn bitwise(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, the CPU has {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        Some(i) => Err(format!("{what}: element {i} is {:e}, the CPU's {:e}", got[i], want[i])),
        None => Ok(()),
    }
}

/// Every element within `rtol` of the CPU's, relative to the larger of its own magnitude
/// and `floor` (the scale below which a difference is rounding in the terms that cancelled,
/// e.g. 1e-5 of the largest magnitude of the row); no NaN.
pub fn close(what: &str, got: &[f32], want: &[f32], rtol: f64, floor: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, the CPU has {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g64, w64) = (g as f64, w as f64);
        let err = (g64 - w64).abs();
        if err.is_nan() || err > rtol * w64.abs().max(floor) {
            return Err(format!(
                "{what}: element {i} is {g:e}, the CPU's {w:e} (tolerance {rtol:e} relative)"
            ));
        }
    }
    Ok(())
}

/// bf16 outputs (as bits) against the CPU's f32: every element is the bf16 rounding (to
/// nearest even) of some value within `rtol` * |CPU's| + `floor` of the CPU's, i.e. lies
/// between the roundings of the two ends of that interval. A bf16 kernel computes in fp32
/// and rounds once on its store, so this is `close`'s question asked before the rounding;
/// with both tolerances 0 it asks for the rounding of the CPU's value itself. No NaN.
pub fn rounds_from(what: &str, got: &[u16], want: &[f32], rtol: f64, floor: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, the CPU has {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = half::bf16::from_bits(g);
        let within = if w.is_finite() {
            let tol = rtol * (w as f64).abs() + floor;
            let lo = half::bf16::from_f32((w as f64 - tol) as f32);
            let hi = half::bf16::from_f32((w as f64 + tol) as f32);
            lo <= g && g <= hi
        } else {
            g.to_f32() == w
        };
        if !within {
            return Err(format!(
                "{what}: element {i} is {g:e} in bf16, the CPU's {w:e} (tolerance {rtol:e} relative, \
                 {floor:e} absolute)"
            ));
        }
    }
    Ok(())
}

/// `xs` rounded to bf16 (to nearest even): the bits, for a bf16 buffer of the emulator.
pub fn bf16_bits(xs: &[f32]) -> Vec<u16> {
    xs.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect()
}

/// The values of bf16 `bits`, exactly, as f32: what the CPU is given where a kernel reads
/// them.
pub fn bf16_values(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect()
}

/// How a kernel stores its activations and their gradients: in f32, or in bf16 through the
/// kernel's `NAME_bf16` twin, which takes the same arguments with those buffers bf16 (and
/// computes in f32, rounding once on each store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            Storage::F32 => "f32",
            Storage::Bf16 => "bf16",
        })
    }
}

/// How close an activation output must be to the CPU's, said for f32 storage; bf16 storage
/// is asked the same before its one rounding (`rounds_from`).
#[derive(Clone, Copy, Debug)]
pub enum Tolerance {
    /// f32: the CPU's bits. bf16: the rounding of the CPU's value.
    Exact,
    /// f32: `close` with this `rtol` and `floor`. bf16: the rounding of a value within
    /// `rtol` * (|CPU's| + `floor`) of the CPU's (`close` allows `rtol` of the larger of the
    /// two).
    Close { rtol: f64, floor: f64 },
}

impl Storage {
    pub const BOTH: [Storage; 2] = [Storage::F32, Storage::Bf16];

    /// The kernel `name` of this storage, as the device names it: `name` itself, or its
    /// bf16 twin.
    pub fn kernel(self, name: &'static str) -> &'static str {
        kernel_name(name, self.dtype())
    }

    /// The device's element type of this storage.
    pub fn dtype(self) -> DType {
        match self {
            Storage::F32 => DType::F32,
            Storage::Bf16 => DType::Bf16,
        }
    }

    /// `xs` as a buffer of this storage holds them (rounded to nearest even in bf16): what
    /// the CPU is given where a kernel reads them.
    pub fn round(self, xs: Vec<f32>) -> Vec<f32> {
        match self {
            Storage::F32 => xs,
            Storage::Bf16 => bf16_values(&bf16_bits(&xs)),
        }
    }

    /// A buffer of this storage holding `xs`, values `round` gave (so that the CPU sees what
    /// the kernel reads).
    pub fn buffer(self, run: &mut Run, xs: &[f32]) -> Buf {
        match self {
            Storage::F32 => run.buffer(xs),
            Storage::Bf16 => {
                let bits = bf16_bits(xs);
                let exact = bf16_values(&bits).iter().zip(xs).all(|(b, x)| b.to_bits() == x.to_bits());
                assert!(exact, "a bf16 buffer of values not rounded to bf16: the CPU would see others");
                run.buffer(&bits)
            }
        }
    }

    /// An output buffer of `len` NaNs: an element the kernel does not write fails its check.
    pub fn output(self, run: &mut Run, len: usize) -> Buf {
        match self {
            Storage::F32 => run.buffer(&vec![f32::NAN; len]),
            Storage::Bf16 => run.buffer(&vec![0xffffu16; len]),
        }
    }

    /// The last read of `buf`, a buffer of this storage, as f32 (bf16 exactly).
    pub fn read(self, outputs: &Outputs, buf: Buf) -> Vec<f32> {
        match self {
            Storage::F32 => outputs.get(buf),
            Storage::Bf16 => bf16_values(&outputs.get(buf)),
        }
    }

    /// An activation output, as `read` gave it, against the CPU's `want`.
    pub fn check(self, what: &str, got: &[f32], want: &[f32], tolerance: Tolerance) -> Result<(), String> {
        match (self, tolerance) {
            (Storage::F32, Tolerance::Exact) => bitwise(what, got, want),
            (Storage::F32, Tolerance::Close { rtol, floor }) => close(what, got, want, rtol, floor),
            // The bits of `got` again: each is a bf16 value, so rounds to itself.
            (Storage::Bf16, Tolerance::Exact) => rounds_from(what, &bf16_bits(got), want, 0.0, 0.0),
            (Storage::Bf16, Tolerance::Close { rtol, floor }) => {
                rounds_from(what, &bf16_bits(got), want, rtol, rtol * floor)
            }
        }
    }
}

/// The largest magnitude of `xs`.
pub fn max_abs(xs: &[f32]) -> f64 {
    xs.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()))
}

/// SplitMix64 with a fixed seed per test: the harness is repeatable.
pub type Rng = kernels::SplitMix64;

#[test]
fn rounds_from_takes_the_roundings_within_tolerance_and_no_more() {
    let bits = |x: f32| half::bf16::from_f32(x).to_bits();
    // Near 1 bf16's step is 2^-7. Exact, the only rounding of 1 itself is 1.
    assert!(rounds_from("exact", &[bits(1.0)], &[1.0], 0.0, 0.0).is_ok());
    assert!(rounds_from("exact", &[bits(1.0078125)], &[1.0], 0.0, 0.0).is_err());
    // Half a step up is a tie, which rounds to even (1): the next value is still out...
    assert!(rounds_from("tie", &[bits(1.0078125)], &[1.0], 0.0, 2f64.powi(-8)).is_err());
    // ...and just past it, in: 1.0045 rounds to 1 + 2^-7.
    assert!(rounds_from("past the tie", &[bits(1.0078125)], &[1.0], 0.0, 0.0045).is_ok());
    assert!(rounds_from("below", &[bits(0.99609375)], &[1.0], 0.0, 0.0045).is_ok());
    // Relative: 1% of 100 reaches 101 (bf16's step there is 0.5), not 101.5.
    assert!(rounds_from("relative", &[bits(101.0), bits(-99.0)], &[100.0, -100.0], 1e-2, 0.0).is_ok());
    assert!(rounds_from("relative", &[bits(101.5)], &[100.0], 1e-2, 0.0).is_err());
    // NaN never passes, nor does a length that differs.
    assert!(rounds_from("nan", &[half::bf16::NAN.to_bits()], &[1.0], 1.0, 1.0).is_err());
    assert!(rounds_from("length", &[bits(1.0)], &[1.0, 1.0], 0.0, 0.0).is_err());
}
