//! Two hosts on one machine: two network namespaces, each a host with its own addresses,
//! joined by two veth pairs as cluster nodes are by two networks: a data link, which the
//! ranks' tensors cross (OpenMPI's TCP transport), and a management link, which OpenMPI's
//! launcher and daemons use (its rsh agent enters the other namespace). p = 2, a stage on
//! each host:
//! - the run equals the threads run bit for bit, its tensors crossing the data link;
//! - a rank killed on the second host ends the job within 10 s;
//! - a permanent partition (the data link set down) ends the job within the distributed
//!   timeout (1 minute here) plus 30 s, with a line that names the peer;
//! - a partition healed within the timeout lets the run finish, bit for bit.
//!
//! A partition that also cut the management link would leave mpirun, once the ranks have
//! ended the job, waiting for its daemon on the far side until TCP gave up on their
//! connection (Linux's `net.ipv4.tcp_retries2`: about 15 minutes by default): that wait is
//! the launcher's, not the run's.
//!
//! Each test skips, saying why, where namespaces cannot be made (not root, no `ip`), or
//! where `mpirun` or the `mpi` feature is missing. Every test makes its own pair of
//! namespaces, named after this process and the test, and removes them (and whatever runs
//! in them) however it ends.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The data network (the ranks' tensors) and the management network (the launcher's), and
/// the first and second host's address on each.
const DATA: [&str; 3] = ["10.231.0.0/24", "10.231.0.1", "10.231.0.2"];
const MANAGEMENT: [&str; 3] = ["10.232.0.0/24", "10.232.0.1", "10.232.0.2"];

/// Two namespace hosts: `first` (where mpirun and rank 0 run) and `second` (rank 1),
/// joined by two veth pairs; `data_link` is the first host's end of the data link.
struct Hosts {
    first: String,
    second: String,
    data_link: String,
    /// OpenMPI's rsh agent: runs a command in the namespace of the host it is given.
    agent: PathBuf,
}

fn ip(args: &[&str]) -> std::io::Result<Output> {
    Command::new("ip").args(args).output()
}

/// Runs `ip` and fails the test unless it succeeds.
fn ip_ok(args: &[&str]) -> String {
    let out = ip(args).unwrap();
    assert!(out.status.success(), "ip {}: {}", args.join(" "), stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Hosts {
    /// The two hosts of test `name` (a few letters), or None, having said why, where they
    /// cannot be made or MPI cannot run.
    fn new(name: &str, dir: &Path) -> Option<Hosts> {
        if !mpi_available() {
            return None;
        }
        let tag = format!("pt{}{name}", std::process::id());
        let hosts = Hosts {
            first: format!("{tag}a"),
            second: format!("{tag}b"),
            data_link: format!("{tag}d"),
            agent: dir.join("agent.sh"),
        };
        match ip(&["netns", "add", &hosts.first]) {
            Err(e) => {
                eprintln!("skipped: cannot run `ip` ({e}); two-host tests need iproute2 and root");
                return None;
            }
            Ok(out) if !out.status.success() => {
                eprintln!(
                    "skipped: cannot make a network namespace (`ip netns add`: {}); two-host tests need root",
                    stderr(&out).trim()
                );
                return None;
            }
            Ok(_) => {}
        }
        // From here the guard removes whatever was made, should a step fail.
        ip_ok(&["netns", "add", &hosts.second]);
        // The kernel reports a new link's carrier up to a second later; until then it drops
        // what is sent, and OpenMPI's daemon would not connect.
        let start = Instant::now();
        for (net, first_end, second_end) in [
            (DATA, hosts.data_link.clone(), format!("{tag}e")),
            (MANAGEMENT, format!("{tag}m"), format!("{tag}n")),
        ] {
            ip_ok(&[
                "link",
                "add",
                &first_end,
                "netns",
                &hosts.first,
                "type",
                "veth",
                "peer",
                "name",
                &second_end,
                "netns",
                &hosts.second,
            ]);
            let ends = [(&hosts.first, &first_end, net[1]), (&hosts.second, &second_end, net[2])];
            for (ns, link, addr) in ends {
                ip_ok(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", link]);
                ip_ok(&["-n", ns, "link", "set", link, "up"]);
                ip_ok(&["-n", ns, "link", "set", "lo", "up"]);
            }
            for (ns, link, _) in ends {
                while !ip_ok(&["-n", ns, "link", "show", link]).contains("state UP") {
                    assert!(start.elapsed() < Duration::from_secs(10), "{link} is not up");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let script = format!(
            "#!/bin/sh\n\
             # OpenMPI's rsh agent for two namespace hosts: `agent.sh HOST COMMAND...`.\n\
             host=$1; shift\n\
             case \"$host\" in\n\
             {}) ns={} ;;\n\
             {}) ns={} ;;\n\
             *) echo \"agent.sh: no host $host\" >&2; exit 1 ;;\n\
             esac\n\
             exec ip netns exec \"$ns\" sh -c \"$*\"\n",
            MANAGEMENT[1], hosts.first, MANAGEMENT[2], hosts.second
        );
        std::fs::write(&hosts.agent, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hosts.agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(hosts)
    }

    /// `mpirun` in the first host for one rank on each host, the ranks' traffic over TCP
    /// on the data link only, ending in the binary.
    fn mpirun(&self) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.first, "mpirun"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .args(["--mca", "plm_rsh_agent", &self.agent.display().to_string()])
            .args(["--host", &format!("{}:1,{}:1", MANAGEMENT[1], MANAGEMENT[2]), "-np", "2"])
            .args(["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", DATA[0]])
            .args(["--mca", "oob_tcp_if_include", MANAGEMENT[0], "--mca", "mpi_yield_when_idle", "1"])
            .arg(env!("CARGO_BIN_EXE_pipetrain"));
        c
    }

    /// Takes the data link between the hosts down, or up again.
    fn set_data_link(&self, state: &str) {
        ip_ok(&["-n", &self.first, "link", "set", &self.data_link, state]);
    }

    /// Bytes the first host has sent over the data link.
    fn sent_bytes(&self) -> u64 {
        let path = format!("/sys/class/net/{}/statistics/tx_bytes", self.data_link);
        let out = Command::new("ip").args(["netns", "exec", &self.first, "cat", &path]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// The pids of the processes running in `ns`.
    fn pids(ns: &str) -> Vec<u32> {
        ip(&["netns", "pids", ns])
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
            })
            .unwrap_or_default()
    }

    /// The pipetrain process on the second host: rank 1.
    fn second_rank(&self) -> u32 {
        let ours = |pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "pipetrain")
        };
        let found: Vec<u32> = Hosts::pids(&self.second).into_iter().filter(ours).collect();
        assert_eq!(found.len(), 1, "one rank runs on the second host: {found:?}");
        found[0]
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in [&self.first, &self.second] {
            for pid in Hosts::pids(ns) {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            // Deleting a namespace deletes its ends of the veth pairs, and so the pairs.
            let _ = ip(&["netns", "delete", ns]);
        }
    }
}

/// p = 2 on the small model, with `extra` flags.
fn p2(extra: &[(&str, String)]) -> Vec<String> {
    let mut a = vec![("pipeline-model-parallel-size", "2".to_string()), ("global-batch-size", "8".into())];
    a.extend(extra.iter().cloned());
    flags(&a)
}

#[test]
fn two_hosts_over_tcp_give_the_threads_run_bit_for_bit() {
    let dir = temp_dir("two-hosts-equal");
    let Some(hosts) = Hosts::new("eq", &dir) else { return };
    let a = p2(&[]);
    let threads = run_small(&dir, "threads", &a);
    let (before, start) = (hosts.sent_bytes(), Instant::now());
    let run = dir.join("hosts");
    let out = hosts.mpirun().args(train_args(&config(&dir), &run, &a)).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    eprintln!("two hosts: p = 2 over TCP took {:?}", start.elapsed());
    assert_eq!(losses(&run), losses(&threads), "losses differ from threads");
    assert!(weights(&run) == weights(&threads), "weights differ from threads");
    // The activations alone (3 steps, 4 microbatches of [2, 16, 32] f32) crossed the data link.
    let sent = hosts.sent_bytes() - before;
    assert!(sent > 3 * 4 * 2 * 16 * 32 * 4, "only {sent} bytes crossed the data link");
}

#[test]
fn two_hosts_a_rank_killed_on_the_second_host_ends_the_job_within_10_s() {
    let dir = temp_dir("two-hosts-kill");
    let Some(hosts) = Hosts::new("kill", &dir) else { return };
    let a = p2(&[("train-iters", "100000".into()), ("lr-decay-iters", "100000".into())]);
    let child = spawn_until(hosts.mpirun(), &config(&dir), &dir.join("run"), &a, 5);
    let victim = hosts.second_rank();
    assert!(Command::new("kill").args(["-KILL", &victim.to_string()]).status().unwrap().success());
    let (out, took) = wait_with_deadline(child, Duration::from_secs(10));
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("rank 1"), "the message does not name rank 1: {err}");
    eprintln!("two hosts: the job ended {took:?} after rank 1 was killed on the second host");
}

#[test]
fn two_hosts_a_permanent_partition_ends_the_job_within_the_timeout_naming_the_peer() {
    let dir = temp_dir("two-hosts-cut");
    let Some(hosts) = Hosts::new("cut", &dir) else { return };
    let a = p2(&[
        ("train-iters", "100000".into()),
        ("lr-decay-iters", "100000".into()),
        ("save-interval", "2".into()),
        ("distributed-timeout-minutes", "1".into()),
    ]);
    let run = dir.join("run");
    let child = spawn_until(hosts.mpirun(), &config(&dir), &run, &a, 5);
    hosts.set_data_link("down");
    let (out, took) = wait_with_deadline(child, Duration::from_secs(60 + 30));
    let err = stderr(&out);
    eprintln!("two hosts: the job ended {took:?} after the link went down, for good");
    assert!(!out.status.success(), "{err}");
    assert!(took >= Duration::from_secs(60), "ended after {took:?}, before the timeout: {err}");
    // Each side names the other, whichever of them ended the job first.
    let line = err
        .lines()
        .find(|l| l.starts_with("error: rank ") && l.ends_with(" within 60 s (distributed_timeout_minutes)"))
        .unwrap_or_else(|| panic!("no timeout line: {err}"));
    let peer = match &line[..14] {
        "error: rank 0:" => "rank 1 (stage 1)",
        _ => "rank 0 (stage 0)",
    };
    assert!(line.contains(": step ") && line.contains(peer), "{line}");
    // The last checkpoint is whole: a resume from it runs.
    let saved: usize = latest(&run).trim_start_matches("step_").parse().unwrap();
    let mut resume = a.clone();
    resume.extend(flags(&[("train-iters", (saved + 1).to_string())]));
    resume.push("--resume".into());
    let o = train(&config(&dir), &run, &resume.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn two_hosts_a_partition_healed_within_the_timeout_finishes_bit_for_bit() {
    let dir = temp_dir("two-hosts-heal");
    let Some(hosts) = Hosts::new("heal", &dir) else { return };
    let a = p2(&[("train-iters", "40".into()), ("distributed-timeout-minutes", "1".into())]);
    let threads = run_small(&dir, "threads", &a);
    let run = dir.join("run");
    let start = Instant::now();
    let child = spawn_until(hosts.mpirun(), &config(&dir), &run, &a, 5);
    hosts.set_data_link("down");
    std::thread::sleep(Duration::from_secs(20));
    hosts.set_data_link("up");
    let (out, _) = wait_with_deadline(child, Duration::from_secs(60));
    let took = start.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!("two hosts: 40 steps with a 20 s partition took {took:?}");
    assert!(took >= Duration::from_secs(20), "the partition did not hold the run: {took:?}");
    assert_eq!(losses(&run), losses(&threads), "losses differ from an undisturbed run");
    assert!(weights_at(&run, 40) == weights_at(&threads, 40), "weights differ from an undisturbed run");
}
