//! Ranks in threads of this process, each with its own stream.

use super::super::api::*;
use super::super::calls::*;
use super::{bits, ranks, unique_id, Buffer, Rank};
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t, ncclResult_t};
use half::bf16;
use ncclDataType_t::*;
use ncclRedOp_t::*;
use ncclResult_t::*;
use std::ffi::c_void;
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[test]
fn grouped_sends_and_receives_complete_in_either_order() {
    let got = ranks(3, |r| {
        let (next, prev) = ((r.rank + 1) % 3, (r.rank + 2) % 3);
        let out = Buffer::new(&[r.rank as f32 + 0.5; 5]);
        let (first, second) = (Buffer::new(&[0f32; 5]), Buffer::new(&[0f32; 5]));
        // SAFETY (both groups): live handles and buffers of 5 f32s.
        unsafe {
            // Every rank receives before it sends: ungrouped, each would wait for the others.
            assert_eq!(ncclGroupStart(), ncclSuccess);
            assert_eq!(ncclRecv(first.ptr(), 5, ncclFloat32, prev as i32, r.comm, r.s()), ncclSuccess);
            assert_eq!(ncclSend(out.ptr(), 5, ncclFloat32, next as i32, r.comm, r.s()), ncclSuccess);
            assert_eq!(ncclGroupEnd(), ncclSuccess);
            assert_eq!(ncclGroupStart(), ncclSuccess);
            assert_eq!(ncclSend(out.ptr(), 5, ncclFloat32, prev as i32, r.comm, r.s()), ncclSuccess);
            assert_eq!(ncclRecv(second.ptr(), 5, ncclFloat32, next as i32, r.comm, r.s()), ncclSuccess);
            assert_eq!(ncclGroupEnd(), ncclSuccess);
        }
        r.sync();
        assert_eq!(r.async_error(), ncclSuccess);
        (first.read(), second.read())
    });
    for (rank, (first, second)) in got.into_iter().enumerate() {
        assert_eq!(first, vec![((rank + 2) % 3) as f32 + 0.5; 5]);
        assert_eq!(second, vec![((rank + 1) % 3) as f32 + 0.5; 5]);
    }
}

#[test]
fn an_all_reduce_adds_in_rank_order_on_every_rank() {
    // Element 0: (1e8 + 1) + -1e8 = 0 (1e8 + 1 rounds to 1e8); any order that adds the 1
    // last gives 1. Element 1: (1 + 1e8) + -1e8 = 0 as well, where 1e8 first gives 1.
    let contributions = [[1e8f32, 1.0, 0.25], [1.0, 1e8, 0.5], [-1e8, -1e8, 2.0]];
    let got = ranks(3, |r| {
        let send = Buffer::new(&contributions[r.rank]);
        let (sum, max) = (Buffer::new(&[f32::NAN; 3]), Buffer::new(&[f32::NAN; 3]));
        // SAFETY: live handles and buffers of 3 f32s.
        unsafe {
            assert_eq!(
                ncclAllReduce(send.ptr(), sum.ptr(), 3, ncclFloat32, ncclSum, r.comm, r.s()),
                ncclSuccess
            );
            assert_eq!(
                ncclAllReduce(send.ptr(), max.ptr(), 3, ncclFloat32, ncclMax, r.comm, r.s()),
                ncclSuccess
            );
        }
        r.sync();
        (bits(&sum.read()), max.read())
    });
    for (sum, max) in got {
        assert_eq!(sum, bits(&[0.0, 0.0, 2.75]));
        assert_eq!(max, vec![1e8, 1e8, 2.0]);
    }
}

#[test]
fn a_bf16_all_reduce_rounds_each_step_in_place() {
    // 256 + 1 rounds to 256 in bf16, twice: 256; 1 + 1 + 256 is 258 exactly.
    let contributions = [[256.0f32, 1.0], [1.0, 1.0], [1.0, 256.0]];
    let got = ranks(3, |r| {
        let buf = Buffer::new(&contributions[r.rank].map(bf16::from_f32));
        // SAFETY: a live handle and a buffer of 2 bf16s, reduced in place.
        let called = unsafe { ncclAllReduce(buf.ptr(), buf.ptr(), 2, ncclBfloat16, ncclSum, r.comm, r.s()) };
        assert_eq!(called, ncclSuccess);
        r.sync();
        buf.read()
    });
    for sum in got {
        assert_eq!(sum, [bf16::from_f32(256.0), bf16::from_f32(258.0)]);
    }
}

#[test]
fn broadcasts_from_every_root_in_one_group() {
    // As pipetrain's NCCL sum does: each member broadcasts its tensor, in one group.
    let got = ranks(3, |r| {
        let buffers: Vec<Buffer<i64>> =
            (0..3).map(|i| Buffer::new(&[if i == r.rank { 10 * i as i64 + 7 } else { -1 }; 2])).collect();
        // SAFETY: live handles and buffers of 2 i64s.
        unsafe {
            assert_eq!(ncclGroupStart(), ncclSuccess);
            for (root, b) in buffers.iter().enumerate() {
                let called = ncclBroadcast(b.ptr(), b.ptr(), 2, ncclInt64, root as i32, r.comm, r.s());
                assert_eq!(called, ncclSuccess);
            }
            assert_eq!(ncclGroupEnd(), ncclSuccess);
        }
        r.sync();
        buffers.iter().map(Buffer::read).collect::<Vec<_>>()
    });
    for buffers in got {
        assert_eq!(buffers, vec![vec![7, 7], vec![17, 17], vec![27, 27]]);
    }
}

#[test]
fn all_gather_and_reduce_scatter_place_each_ranks_part() {
    let got = ranks(3, |r| {
        let mine = Buffer::new(&[r.rank as i32 * 2, r.rank as i32 * 2 + 1]);
        let gathered = Buffer::new(&[0i32; 6]);
        let scattered = Buffer::new(&[0i32; 2]);
        // SAFETY: live handles; 2 i32s per rank.
        unsafe {
            assert_eq!(ncclAllGather(mine.ptr(), gathered.ptr(), 2, ncclInt32, r.comm, r.s()), ncclSuccess);
            let called =
                ncclReduceScatter(gathered.ptr(), scattered.ptr(), 2, ncclInt32, ncclSum, r.comm, r.s());
            assert_eq!(called, ncclSuccess);
        }
        r.sync();
        (gathered.read(), scattered.read())
    });
    for (rank, (gathered, scattered)) in got.into_iter().enumerate() {
        assert_eq!(gathered, vec![0, 1, 2, 3, 4, 5]);
        // Every rank gathered the same six values: its part of their sum is three times its own.
        assert_eq!(scattered, vec![6 * rank as i32, 6 * rank as i32 + 3]);
    }
}

#[test]
fn communicators_over_the_same_ranks_keep_their_messages_apart() {
    let (a, b) = (unique_id(), unique_id());
    std::thread::scope(|s| {
        for rank in 0..2 {
            s.spawn(move || {
                let (on_a, on_b) = (Rank::join(a, 2, rank), Rank::join(b, 2, rank));
                let peer = 1 - rank as i32;
                let (sent_a, sent_b) = (Buffer::new(&[rank as u8 + 10]), Buffer::new(&[rank as u8 + 20]));
                let (got_a, got_b) = (Buffer::new(&[0u8]), Buffer::new(&[0u8]));
                // SAFETY: live handles and one-byte buffers. Each communicator has its own
                // stream, and B's exchange is issued first.
                unsafe {
                    ncclGroupStart();
                    ncclSend(sent_b.ptr(), 1, ncclUint8, peer, on_b.comm, on_b.s());
                    ncclRecv(got_b.ptr(), 1, ncclUint8, peer, on_b.comm, on_b.s());
                    ncclSend(sent_a.ptr(), 1, ncclUint8, peer, on_a.comm, on_a.s());
                    ncclRecv(got_a.ptr(), 1, ncclUint8, peer, on_a.comm, on_a.s());
                    assert_eq!(ncclGroupEnd(), ncclSuccess);
                }
                on_a.sync();
                on_b.sync();
                assert_eq!((got_a.read(), got_b.read()), (vec![peer as u8 + 10], vec![peer as u8 + 20]));
            });
        }
    });
}

#[test]
fn a_receive_of_the_wrong_size_fails_its_communicator() {
    let got = ranks(2, |r| {
        let buf = Buffer::new(&[0f32; 4]);
        // SAFETY (all): live handles; rank 0 sends 4 f32s, rank 1 expects 3.
        unsafe {
            match r.rank {
                0 => assert_eq!(ncclSend(buf.ptr(), 4, ncclFloat32, 1, r.comm, r.s()), ncclSuccess),
                _ => assert_eq!(ncclRecv(buf.ptr(), 3, ncclFloat32, 0, r.comm, r.s()), ncclSuccess),
            }
        }
        r.sync();
        let error = r.async_error();
        // SAFETY: as above.
        let later = (r.rank == 1).then(|| unsafe { ncclRecv(buf.ptr(), 4, ncclFloat32, 0, r.comm, r.s()) });
        (error, later)
    });
    assert_eq!(got[0].0, ncclSuccess, "the sender's data was delivered");
    assert_eq!(
        got[1],
        (ncclInvalidUsage, Some(ncclInvalidUsage)),
        "the receiver's communicator failed, and stays failed"
    );
}

#[test]
fn abort_returns_a_receive_that_would_wait_forever() {
    let aborted = Barrier::new(2);
    let got = ranks(2, |r| {
        let buf = Buffer::new(&[0u8; 8]);
        if r.rank == 1 {
            // SAFETY: live handles; rank 0 never sends.
            assert_eq!(unsafe { ncclRecv(buf.ptr(), 8, ncclUint8, 0, r.comm, r.s()) }, ncclSuccess);
            let mark = r.stream().enqueue(Box::new(|| {}));
            std::thread::sleep(Duration::from_millis(200));
            assert!(!r.stream().is_done(mark), "the receive waits");
            let start = Instant::now();
            assert_eq!(ncclCommAbort(r.comm), ncclSuccess);
            r.stream().wait_for(mark);
            let took = start.elapsed();
            // A second abort (cudarc's drop after a watchdog's) is refused by name.
            assert_eq!(
                ncclCommAbort(std::mem::replace(&mut r.comm, std::ptr::null_mut())),
                ncclInvalidArgument
            );
            aborted.wait();
            return (took, ncclSuccess, ncclSuccess);
        }
        aborted.wait();
        // Rank 1 left on purpose: no error until an operation needs it.
        let before = r.async_error();
        // SAFETY: live handles.
        assert_eq!(unsafe { ncclRecv(buf.ptr(), 8, ncclUint8, 1, r.comm, r.s()) }, ncclSuccess);
        r.sync();
        (Duration::ZERO, before, r.async_error())
    });
    assert!(got[1].0 < Duration::from_secs(2), "the abort took {:?}", got[1].0);
    assert_eq!((got[0].1, got[0].2), (ncclSuccess, ncclRemoteError));
}

#[test]
fn admission_refuses_ranks_that_disagree_on_the_size() {
    let id = unique_id();
    let codes: Vec<ncclResult_t> = std::thread::scope(|s| {
        let joins: Vec<_> = [(2, 0), (3, 1)]
            .into_iter()
            .map(|(size, rank)| {
                s.spawn(move || {
                    let mut comm = std::ptr::null_mut();
                    // SAFETY: a valid place for the handle.
                    unsafe { ncclCommInitRank(&mut comm, size, id, rank) }
                })
            })
            .collect();
        joins.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(codes, vec![ncclInvalidUsage, ncclInvalidUsage]);
}

#[test]
fn calls_with_bad_arguments_are_refused_at_once() {
    ranks(1, |r| {
        let buf = Buffer::new(&[0f32; 4]);
        let host = [0f32; 4];
        // SAFETY (all): live handles; the calls are checked and refused before any use.
        unsafe {
            assert_eq!(ncclSend(buf.ptr(), 4, ncclFloat32, 1, r.comm, r.s()), ncclInvalidArgument);
            assert_eq!(ncclSend(buf.ptr(), 5, ncclFloat32, 0, r.comm, r.s()), ncclInvalidArgument);
            let host = host.as_ptr() as *mut c_void;
            assert_eq!(
                ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, r.comm, r.s()),
                ncclInvalidArgument
            );
            let fp8 = ncclAllReduce(buf.ptr(), buf.ptr(), 4, ncclFloat8e4m3, ncclSum, r.comm, r.s());
            assert_eq!(fp8, ncclInvalidArgument);
            // A refusal inside a group fails the group's end too.
            ncclGroupStart();
            assert_eq!(ncclRecv(buf.ptr(), 4, ncclFloat32, 2, r.comm, r.s()), ncclInvalidArgument);
            assert_eq!(ncclGroupEnd(), ncclInvalidArgument);
            assert_eq!(ncclGroupEnd(), ncclInvalidUsage, "an end with no start");
        }
    });
}

#[test]
fn init_all_makes_one_rank_per_gpu_and_queries_answer() {
    let mut comm = std::ptr::null_mut();
    let (mut size, mut rank, mut device) = (0, -1, -1);
    // SAFETY: one GPU (the default), so one handle; valid outputs.
    unsafe {
        assert_eq!(ncclCommInitAll(&mut comm, 1, std::ptr::null()), ncclSuccess);
        assert_eq!(ncclCommCount(comm, &mut size), ncclSuccess);
        assert_eq!(ncclCommUserRank(comm, &mut rank), ncclSuccess);
        assert_eq!(ncclCommCuDevice(comm, &mut device), ncclSuccess);
        assert_eq!(ncclCommInitAll(&mut comm, 1, [5].as_ptr()), ncclInvalidArgument, "there is no GPU 5");
        assert_eq!(ncclCommDestroy(comm), ncclSuccess);
    }
    assert_eq!((size, rank, device), (1, 0, 0));
}
