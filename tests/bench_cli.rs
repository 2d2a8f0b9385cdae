//! `pipetrain bench` end to end on the small config: the recompute table's rows, with the
//! activation and host peaks the ledgers measured equal to the memory model's, and one-line
//! errors.

mod common;
use common::*;

fn bench(config: &std::path::Path, extra: &[&str]) -> std::process::Output {
    bin().args(["bench", "recompute", "--steps", "1", "--config"]).arg(config).args(extra).output().unwrap()
}

#[test]
fn recompute_table_measures_what_the_model_predicts() {
    let dir = temp_dir("bench-recompute");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let out = bench(&cfg, &["--variants", "none,selective core_attn,full uniform N=1,offload core_attn"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = table.lines().skip(1).take_while(|l| !l.starts_with('(')).collect();
    let names: Vec<&str> = rows.iter().map(|r| r[..22].trim_end()).collect();
    assert_eq!(names, ["none", "selective core_attn", "full uniform N=1", "offload core_attn"], "{table}");
    let (mut saved, mut host) = (Vec::new(), Vec::new());
    for row in &rows {
        // ... activations, predicted, saved, host, predicted: each size a number and a unit.
        let cols: Vec<&str> = row[22..].split_whitespace().collect();
        let [.., measured, measured_unit, predicted, predicted_unit, cut, on_host, on_host_unit, predicted_host, predicted_host_unit] =
            cols[..]
        else {
            panic!("{row}")
        };
        assert_eq!((measured, measured_unit), (predicted, predicted_unit), "{row}");
        assert_eq!((on_host, on_host_unit), (predicted_host, predicted_host_unit), "{row}");
        saved.push(cut.trim_end_matches('%').parse::<f64>().unwrap());
        host.push(on_host.parse::<f64>().unwrap());
    }
    assert_eq!(saved[0], 0.0, "{table}");
    assert!(0.0 < saved[1] && saved[1] < saved[2] && 0.0 < saved[3], "{table}");
    assert_eq!(host[..3], [0.0; 3], "{table}");
    assert!(host[3] > 0.0, "{table}");
}

#[test]
fn unknown_variant_is_one_line() {
    let dir = temp_dir("bench-variants");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    let out = bench(&cfg, &["--variants", "none,selective everything"]);
    assert_user_error(&out, "--variants: no variant `selective everything`; expected some of none, ");
    // No timed step would leave the table no median to take.
    let out = bin().args(["bench", "recompute", "--steps", "0", "--config"]).arg(&cfg).output().unwrap();
    assert_user_error(&out, "error: command line: --steps 0: a benchmark times 1 or more steps\n");
}

/// Without a usable GPU, `bench gpu` and `bench attention` say why in one line and exit 3,
/// apart from a failure (1) and a mistake (2). With a GPU they measure: that is their own
/// run.
#[test]
fn bench_gpu_without_a_gpu_is_one_line_and_exit_3() {
    #[cfg(feature = "cuda")]
    let why = match kernels::cuda::CudaDevice::new(0) {
        Ok(_) => {
            eprintln!("SKIP bench_gpu_without_a_gpu: this machine has a GPU; run `pipetrain bench gpu`");
            return;
        }
        Err(why) => why,
    };
    #[cfg(not(feature = "cuda"))]
    let why = "this binary was built without the `cuda` feature (cargo build --release --features cuda)";
    let dir = temp_dir("bench-gpu");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    for what in ["gpu", "attention"] {
        let out = bin().args(["bench", what, "--config"]).arg(&cfg).output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{what}: {}", stderr(&out));
        assert_eq!(stderr(&out), format!("bench {what}: no usable GPU: {why}\n"));
        assert!(out.stdout.is_empty(), "{what}");
    }
}

/// `bench attention` times the config's own shape beside #21's, so a head size the bf16
/// kernels do not take is the config's mistake: one line, exit 2, before any GPU is opened.
#[test]
fn bench_attention_refuses_a_head_size_the_kernels_do_not_take() {
    let dir = temp_dir("bench-attention-head-size");
    let cfg = write_config(&dir, "c.yaml", &SMALL.replace("hidden_size: 64", "hidden_size: 72"));
    let out = bin().args(["bench", "attention", "--config"]).arg(&cfg).output().unwrap();
    assert_user_error(
        &out,
        "c.yaml: key `hidden_size`: bench attention runs the bf16 kernels, which need a head size \
         (hidden_size / num_attention_heads) that is a multiple of 16 up to 128, got 18",
    );
}
