//! An output file written under a temporary name beside its final one and renamed into place
//! only when complete, so an interrupted or failed `tokenize` leaves no partial file under a
//! final name (the rename is atomic: same directory, same filesystem). An interrupt (Ctrl-C,
//! SIGTERM) removes the temporary files too, before the process ends.

use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::user_error;

/// The temporary files being written, for the interrupt handler to remove.
static IN_FLIGHT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Exit status of a process ended by SIGINT, as shells report it.
const INTERRUPTED: i32 = 130;

/// On Ctrl-C or SIGTERM, removes every temporary file being written and ends the process.
/// The lock is held to the end, so no file is staged or committed meanwhile.
pub fn remove_on_interrupt() {
    let _ = ctrlc::set_handler(|| {
        let in_flight = in_flight();
        for tmp in in_flight.iter() {
            let _ = fs::remove_file(tmp);
        }
        eprintln!("interrupted: {} partial file(s) removed, no complete output touched", in_flight.len());
        std::process::exit(INTERRUPTED);
    });
}

/// The in-flight list, locked; a panic elsewhere leaves it consistent (each change is one
/// push or retain), so a poisoned lock is still good.
fn in_flight() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct StagedFile {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
}

impl StagedFile {
    pub fn create(path: &Path) -> anyhow::Result<StagedFile> {
        let tmp = temp_sibling(path)?;
        let mut in_flight = in_flight();
        let file = File::create(&tmp).map_err(|e| cannot_write(path, &e))?;
        in_flight.push(tmp.clone());
        Ok(StagedFile { path: path.to_path_buf(), tmp, out: BufWriter::with_capacity(1 << 20, file) })
    }

    pub fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.out.write_all(bytes).map_err(|e| cannot_write(&self.path, &e))
    }

    /// Overwrites `bytes` at `offset` (a header whose counts are known only at the end).
    pub fn patch(&mut self, offset: u64, bytes: &[u8]) -> anyhow::Result<()> {
        overwrite_at(&mut self.out, offset, bytes).map_err(|e| cannot_write(&self.path, &e))
    }

    /// Syncs the file and renames it to its final name.
    pub fn commit(mut self) -> anyhow::Result<PathBuf> {
        let r = self.out.flush().and_then(|()| self.out.get_ref().sync_all()).and_then(|()| {
            let mut in_flight = in_flight();
            in_flight.retain(|p| p != &self.tmp);
            fs::rename(&self.tmp, &self.path)
        });
        r.map_err(|e| cannot_write(&self.path, &e))?;
        Ok(self.path.clone())
    }
}

impl Drop for StagedFile {
    /// A file dropped before `commit` (an error) leaves nothing behind; after `commit` the
    /// temporary name no longer exists and this does nothing.
    fn drop(&mut self) {
        let mut in_flight = in_flight();
        in_flight.retain(|p| p != &self.tmp);
        let _ = fs::remove_file(&self.tmp);
    }
}

fn overwrite_at(out: &mut BufWriter<File>, offset: u64, bytes: &[u8]) -> io::Result<()> {
    out.flush()?;
    let f = out.get_mut();
    f.seek(SeekFrom::Start(offset))?;
    f.write_all(bytes)?;
    f.seek(SeekFrom::End(0))?;
    Ok(())
}

fn cannot_write(path: &Path, e: &io::Error) -> anyhow::Error {
    user_error(format!("{}: cannot write: {e}", path.display()))
}

/// `dir/.name.tmp` for `dir/name`.
fn temp_sibling(output: &Path) -> anyhow::Result<PathBuf> {
    let name =
        output.file_name().ok_or_else(|| user_error(format!("{}: not a file name", output.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    Ok(output.with_file_name(tmp_name))
}

/// Writes a small file (the tokenizer record) whole, staged the same way.
pub fn write_whole(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = StagedFile::create(path)?;
    f.write(bytes)?;
    f.commit().map(drop)
}
