//! A binary built without the `mpi` feature, started by a launcher as one of several
//! ranks, stops every rank with one line from rank 0 and exit 2. (CI runs this file in a
//! build without the feature; in a build with it, it skips and says so.)

mod common;
use common::*;

#[test]
fn a_launcher_without_the_mpi_feature_is_one_line_from_rank_0() {
    if cfg!(feature = "mpi") {
        eprintln!("skipped: this binary has the `mpi` feature (run `cargo test --test launch_without_mpi` without it)");
        return;
    }
    let dir = temp_dir("launch-without-mpi");
    let cfg = write_config(&dir, "c.yaml", SMALL);
    for (rank, expect_line) in [("0", true), ("1", false)] {
        let out = bin()
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_RANK", rank)
            .args(["train", "--config"])
            .arg(&cfg)
            .arg("--run-dir")
            .arg(dir.join("run"))
            .output()
            .unwrap();
        if expect_line {
            assert_user_error(&out, "started as one of 2 ranks by mpirun or srun, but this binary was built without the `mpi` feature");
        } else {
            assert_eq!(out.status.code(), Some(2));
            assert_eq!(stderr(&out), "", "only rank 0 speaks");
        }
    }
    assert!(!dir.join("run").exists(), "nothing is written");
}
