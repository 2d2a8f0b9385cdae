//! Ranks in two processes: the test binary runs the same test again as the other rank.

use super::super::api::*;
use super::super::calls::*;
use super::{bits, unique_id, Buffer, Rank};
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId};
use ncclDataType_t::*;
use ncclRedOp_t::*;
use ncclResult_t::*;

/// Set in a second process this test binary runs as a test's other rank: the unique id,
/// in hex, or `make` where that process makes it (and prints it as `id=<hex>`).
const OTHER_RANK: &str = "CUDA_STANDIN_NCCL_TEST_ID";

fn hex(id: &ncclUniqueId) -> String {
    id.internal.iter().map(|&c| format!("{:02x}", c as u8)).collect()
}

fn from_hex(text: &str) -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    for (i, slot) in id.internal.iter_mut().enumerate() {
        *slot = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex") as std::ffi::c_char;
    }
    id
}

/// Runs test `name` of this binary again, in a process of its own, as the other rank.
fn other_rank(name: &str, id: &str) -> std::process::Child {
    let name = name.split_once("::").expect("a crate prefix").1;
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(OTHER_RANK, id)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the test binary runs again")
}

fn succeeded(child: std::process::Child) {
    let status = child.wait_with_output().expect("the other rank ends").status;
    assert!(status.success(), "the other rank failed: {status}");
}

/// Both processes' steps: an all-reduce and an exchange both ways, then rank 1 ends
/// without leaving the communicator, as a crashed process does, while rank 0 waits on it.
/// Rank 1 ends only once rank 0 says so: a rank learns at once that a peer's process has
/// ended, so rank 0 checks its communicator is still whole before that.
fn two_process_steps(r: &Rank) {
    const GO: u8 = 7;
    let send = Buffer::new(&[[1e8f32, 1.5], [1.0, 2.5]][r.rank]);
    let sum = Buffer::new(&[0f32; 2]);
    let out = Buffer::new(&[100 + r.rank as u64; 3]);
    let back = Buffer::new(&[0u64; 3]);
    let peer = 1 - r.rank as i32;
    // SAFETY (all): live handles and buffers of the counts given.
    unsafe {
        assert_eq!(ncclAllReduce(send.ptr(), sum.ptr(), 2, ncclFloat32, ncclSum, r.comm, r.s()), ncclSuccess);
        ncclGroupStart();
        assert_eq!(ncclRecv(back.ptr(), 3, ncclUint64, peer, r.comm, r.s()), ncclSuccess);
        assert_eq!(ncclSend(out.ptr(), 3, ncclUint64, peer, r.comm, r.s()), ncclSuccess);
        assert_eq!(ncclGroupEnd(), ncclSuccess);
    }
    r.sync();
    assert_eq!(bits(&sum.read()), bits(&[1e8, 4.0]));
    assert_eq!(back.read(), vec![100 + peer as u64; 3]);
    assert_eq!(r.async_error(), ncclSuccess);
    if r.rank == 1 {
        let go = Buffer::new(&[0u8]);
        // SAFETY: live handles and one byte.
        assert_eq!(unsafe { ncclRecv(go.ptr(), 1, ncclUint8, 0, r.comm, r.s()) }, ncclSuccess);
        r.sync();
        assert_eq!(go.read(), vec![GO]);
        // Ends without ncclCommDestroy or ncclCommAbort: to the hub, the connection breaks.
        std::process::exit(0);
    }
    let go = Buffer::new(&[GO]);
    // In one group, so that both calls are made before rank 1 can hear it may end.
    // SAFETY: live handles and buffers of the counts given; rank 1 never sends to this receive.
    unsafe {
        ncclGroupStart();
        assert_eq!(ncclSend(go.ptr(), 1, ncclUint8, 1, r.comm, r.s()), ncclSuccess);
        assert_eq!(ncclRecv(back.ptr(), 3, ncclUint64, 1, r.comm, r.s()), ncclSuccess);
        assert_eq!(ncclGroupEnd(), ncclSuccess);
    }
    r.sync();
    assert_eq!(r.async_error(), ncclRemoteError);
}

#[test]
fn ranks_in_two_processes() {
    if let Ok(id) = std::env::var(OTHER_RANK) {
        return two_process_steps(&Rank::join(from_hex(&id), 2, 1));
    }
    let id = unique_id();
    let child = other_rank(concat!(module_path!(), "::ranks_in_two_processes"), &hex(&id));
    two_process_steps(&Rank::join(id, 2, 0));
    succeeded(child);
}

#[test]
fn ranks_fail_when_the_process_holding_the_hub_ends() {
    if std::env::var(OTHER_RANK).is_ok() {
        // Rank 0, in the id's process: sends once, then ends without leaving.
        let id = unique_id();
        println!("id={}", hex(&id));
        let r = Rank::join(id, 2, 0);
        let value = Buffer::new(&[42i32]);
        // SAFETY: live handles and one i32.
        assert_eq!(unsafe { ncclSend(value.ptr(), 1, ncclInt32, 1, r.comm, r.s()) }, ncclSuccess);
        r.sync();
        std::process::exit(0);
    }
    let mut child =
        other_rank(concat!(module_path!(), "::ranks_fail_when_the_process_holding_the_hub_ends"), "make");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let line = std::io::BufRead::lines(stdout)
        .map(|l| l.expect("the other rank's output"))
        // The test harness may have begun the line with the test's name.
        .find_map(|l| l.split_once("id=").map(|(_, id)| id.to_string()))
        .expect("the other rank prints the id");
    let r = Rank::join(from_hex(&line), 2, 1);
    let (first, second) = (Buffer::new(&[0i32]), Buffer::new(&[0i32]));
    // SAFETY: live handles and one i32 each; rank 0 sends only the first.
    unsafe {
        assert_eq!(ncclRecv(first.ptr(), 1, ncclInt32, 0, r.comm, r.s()), ncclSuccess);
        assert_eq!(ncclRecv(second.ptr(), 1, ncclInt32, 0, r.comm, r.s()), ncclSuccess);
    }
    r.sync();
    assert_eq!((first.read(), second.read()), (vec![42], vec![0]), "what was sent before the end arrives");
    assert_eq!(r.async_error(), ncclRemoteError);
    succeeded(child);
}
