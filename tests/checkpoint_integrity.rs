//! Checksummed checkpoints: every checkpoint carries `manifest.sha256`, and every command that
//! loads one (train's resume and `load:`, export, eval, generate) checks it first. A changed
//! byte in any file, or a listed file gone, is one line naming the file, exit 2; a
//! checkpoint without a manifest (from before they were written) loads, with a note, and a
//! Hugging Face directory (which never has one) loads as before.

mod common;
use common::*;
use std::path::Path;
use std::process::Output;

const FILES: [&str; 4] =
    ["model.safetensors", "trainer_state.safetensors", "trainer_state.json", "config.json"];

fn train_small(dir: &Path, run: &str, extra: &[&str]) -> Output {
    train(
        &config(dir),
        &dir.join(run),
        &[&["--peak-flops", "1e9", "--global-batch-size", "2"], extra].concat(),
    )
}

/// Adds 1 to the byte in the middle of `file`; returns the original bytes.
fn flip_middle_byte(file: &Path) -> Vec<u8> {
    let original = std::fs::read(file).unwrap();
    let mut bytes = original.clone();
    let at = bytes.len() / 2;
    bytes[at] = bytes[at].wrapping_add(1);
    std::fs::write(file, bytes).unwrap();
    original
}

fn damaged(file: &Path) -> String {
    format!("error: {}: sha256 ", file.display())
}

#[test]
fn a_changed_byte_in_any_file_of_a_checkpoint_stops_every_loader() {
    let dir = temp_dir("ck-integrity");
    let out = train_small(&dir, "run", &["--train-iters", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ck = dir.join("run/checkpoints/step_000002");
    let data = dir.join("tokens.bin");
    for name in FILES {
        let file = ck.join(name);
        let original = flip_middle_byte(&file);
        let resumed = train_small(&dir, "run", &["--train-iters", "3", "--resume"]);
        assert_user_error(&resumed, &damaged(&file));
        assert!(stderr(&resumed).trim_end().ends_with("in manifest.sha256: the file is damaged"));
        let loaded = train_small(
            &dir,
            &format!("from-{name}"),
            &["--train-iters", "3", "--load", ck.to_str().unwrap()],
        );
        assert_user_error(&loaded, &damaged(&file));
        let hf = dir.join(format!("hf-{name}"));
        let commands: [&[&str]; 3] = [
            &["export", "--hf", hf.to_str().unwrap()],
            &["eval", "--data", data.to_str().unwrap(), "--windows", "2"],
            &["generate", "--max-new-tokens", "2", "--prompt", "a"],
        ];
        for args in commands {
            let o = bin().args(&args[..1]).arg("--checkpoint").arg(&ck).args(&args[1..]).output().unwrap();
            assert_user_error(&o, &damaged(&file));
        }
        std::fs::write(&file, original).unwrap();
    }
    std::fs::remove_file(ck.join("trainer_state.json")).unwrap();
    let resumed = train_small(&dir, "run", &["--train-iters", "3", "--resume"]);
    assert_user_error(
        &resumed,
        &format!("error: {}: missing, but manifest.sha256 lists it", ck.join("trainer_state.json").display()),
    );
}

#[test]
fn a_checkpoint_without_a_manifest_loads_with_a_note() {
    let dir = temp_dir("ck-no-manifest");
    // The lr decays over 3 steps in both parts, so the resume changes nothing a note names.
    let out = train_small(&dir, "run", &["--train-iters", "2", "--lr-decay-iters", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ck = dir.join("run/checkpoints/step_000002");
    std::fs::remove_file(ck.join("manifest.sha256")).unwrap();
    let resumed = train_small(&dir, "run", &["--train-iters", "3", "--lr-decay-iters", "3", "--resume"]);
    let err = stderr(&resumed);
    assert!(resumed.status.success(), "{err}");
    let note = format!(
        "note: {}: no manifest.sha256 (a checkpoint from before they were written); its files are not verified",
        ck.display()
    );
    assert_eq!(err.lines().filter(|l| l.starts_with("note: ")).collect::<Vec<_>>(), [note.as_str()]);
    // Its resumed run's checkpoint has one again, and an export carries one.
    let step3 = dir.join("run/checkpoints/step_000003");
    assert!(step3.join("manifest.sha256").is_file());
    let hf = dir.join("hf");
    let export = bin().args(["export", "--checkpoint"]).arg(&step3).arg("--hf").arg(&hf).output().unwrap();
    assert!(export.status.success(), "{}", stderr(&export));
    let manifest = std::fs::read_to_string(hf.join("manifest.sha256")).unwrap();
    let listed: Vec<&str> = manifest.lines().map(|l| l.split_once("  ").unwrap().1).collect();
    assert_eq!(listed, ["config.json", "model.safetensors"]);
}

/// Hugging Face's format has no manifest: its directories load without a note.
#[test]
fn a_hugging_face_directory_loads_without_a_note() {
    let o = bin()
        .args([
            "generate",
            "--checkpoint",
            "tests/fixtures/hf_tiny",
            "--prompt",
            "!",
            "--max-new-tokens",
            "2",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
}
