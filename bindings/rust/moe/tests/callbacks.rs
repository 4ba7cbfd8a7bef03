//! Callbacks from Rust closures: logger, allocator, profiler, comm hooks; panics become errors.
mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

use common::*;
use moe::{
    AllGatherV, AllToAllV, Comm, CommConfig, CommHooks, CommKind, Context, Layer, LayerConfig, LogLevel,
    ParallelConfig, RangeEvent, ReduceBuf, Status,
};

#[test]
fn logger_closure_receives_messages() {
    let seen = Arc::new(Mutex::new(Vec::<(LogLevel, String)>::new()));
    let sink = seen.clone();
    let ctx = Context::builder().logger(LogLevel::Debug, move |lvl, msg| sink.lock().unwrap().push((lvl, msg.to_owned()))).build().unwrap();
    let err = Layer::new(&ctx, &LayerConfig::new(H, F, E, E + 1)).unwrap_err();
    let log = seen.lock().unwrap();
    assert!(
        log.iter().any(|(l, m)| *l == LogLevel::Error && m == err.message()),
        "the error was not logged: {log:?} / {}",
        err.message()
    );
}

#[test]
fn a_panicking_logger_becomes_a_callback_error() {
    let ctx = Context::builder().logger(LogLevel::Error, |_, _| panic!("logger exploded")).build().unwrap();
    let err = Layer::new(&ctx, &LayerConfig::new(H, F, E, 0)).unwrap_err();
    // the engine's own status stays; the panic is reported in the message
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("logger exploded"), "message: {}", err.message());
    // the panic was consumed: the next good call succeeds
    Layer::new(&ctx, &fixture_config()).unwrap();
}

#[test]
fn allocator_closure_is_called_freed_and_released_once() {
    let (alloc, counts) = CountingAllocator::new();
    {
        let ctx = Context::builder().allocator(alloc).build().unwrap();
        let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
        train_once(&mut layer);
        assert!(counts.allocs.load(SeqCst) > 0, "the engine never called the allocator");
        let stats = ctx.memory_stats().unwrap();
        assert!(stats.total_current_bytes > 0);
        assert_eq!(counts.dropped.load(SeqCst), 0);
    }
    assert_eq!(counts.allocs.load(SeqCst), counts.frees.load(SeqCst), "leaked blocks");
    assert_eq!(counts.live_bytes.load(SeqCst), 0);
    assert_eq!(counts.dropped.load(SeqCst), 1, "release must run exactly once");
}

#[test]
fn allocator_failure_is_out_of_memory() {
    struct Refuse;
    unsafe impl moe::Allocator for Refuse {
        fn alloc(&mut self, _: usize, _: usize) -> Option<std::ptr::NonNull<u8>> {
            None
        }
        fn free(&mut self, _: std::ptr::NonNull<u8>, _: usize) {}
    }
    let ctx = Context::builder().allocator(Refuse).build().unwrap();
    let err = Layer::new(&ctx, &fixture_config()).unwrap_err();
    assert_eq!(err.status(), Status::OutOfMemory);
}

#[test]
fn profiler_ranges_are_balanced() {
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = events.clone();
    let ctx = Context::builder()
        .profiler(move |e| {
            sink.lock().unwrap().push(match e {
                RangeEvent::Push(n) => n.to_owned(),
                RangeEvent::Pop => "pop".to_owned(),
            })
        })
        .build()
        .unwrap();
    let mut layer = Layer::new(&ctx, &fixture_config()).unwrap();
    train_once(&mut layer);
    let ev = events.lock().unwrap();
    let pushes = ev.iter().filter(|e| *e != "pop").count();
    assert!(pushes > 0, "no profiler ranges");
    assert_eq!(pushes, ev.len() - pushes, "unbalanced ranges: {ev:?}");
    assert!(ev.iter().all(|e| e == "pop" || e.starts_with("moe.")));
}

/// One-rank collectives as closures: copy send to recv, sums are identities.
fn one_rank_hooks(calls: Arc<Mutex<Vec<&'static str>>>) -> CommHooks {
    let (c1, c2, c3, c4, c5) = (calls.clone(), calls.clone(), calls.clone(), calls.clone(), calls);
    CommHooks::new(
        0,
        1,
        move |a: AllToAllV<'_>| {
            c1.lock().unwrap().push("all_to_all_v");
            let (s, r, n) = (a.send_offsets[0] as usize, a.recv_offsets[0] as usize, a.send_bytes[0] as usize);
            if a.recv_bytes[0] as usize != n {
                return Err(format!("one rank: send {n} bytes but receive {}", a.recv_bytes[0]));
            }
            a.recv[r..r + n].copy_from_slice(&a.send[s..s + n]);
            Ok(())
        },
        move |a: AllGatherV<'_>| {
            c2.lock().unwrap().push("all_gather_v");
            let r = a.recv_offsets[0] as usize;
            a.recv[r..r + a.send.len()].copy_from_slice(a.send);
            Ok(())
        },
        move |b: ReduceBuf<'_>| {
            c3.lock().unwrap().push(match b {
                ReduceBuf::F32(_) => "all_reduce f32",
                ReduceBuf::F64(_) => "all_reduce f64",
                ReduceBuf::I64(_) => "all_reduce i64",
            });
            Ok(())
        },
        move |_buf: &mut [u8], root| {
            c4.lock().unwrap().push("broadcast");
            if root == 0 { Ok(()) } else { Err(format!("root {root} on one rank")) }
        },
    )
    .barrier(move || {
        c5.lock().unwrap().push("barrier");
        Ok(())
    })
}

#[test]
fn hooks_comm_drives_a_parallel_layer_like_a_plain_one() {
    let fx = Fixture::load();
    let ctx = Context::new().unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let ep = Comm::from_hooks(&ctx, &CommConfig::new(), one_rank_hooks(calls.clone())).unwrap();
    assert_eq!((ep.rank().unwrap(), ep.size().unwrap(), ep.kind().unwrap()), (0, 1, CommKind::Hooks));
    let par = ParallelConfig { ep: Some(&ep), edp: Some(&ep), dp: Some(&ep), bias: Some(&ep), ..Default::default() };
    let mut par_layer = Layer::new_parallel(&ctx, &fixture_config(), &par).unwrap();
    drop(ep); // the layer retains its comms
    let mut plain = fixture_layer(&ctx, &fx);
    for (slot, name) in [(moe::Param::RouterWeight, "param.0"), (moe::Param::ExpertFc1, "param.1"),
                         (moe::Param::ExpertFc2, "param.2"), (moe::Param::ExpertBias, "param.6")] {
        let r = fx.get(name);
        let v = r.f32();
        par_layer.import_param(slot, &moe::TensorRef::new(&v, &r.shape).unwrap()).unwrap();
    }
    train_once(&mut par_layer);
    train_once(&mut plain);
    par_layer.reduce_grads().unwrap();
    par_layer.update_expert_bias(None).unwrap();
    for slot in [moe::Param::RouterWeight, moe::Param::ExpertFc1, moe::Param::ExpertFc2] {
        let a = par_layer.grad(slot).unwrap().to_vec::<f32>().unwrap();
        let b = plain.grad(slot).unwrap().to_vec::<f32>().unwrap();
        assert_close("grad", &widen(&a), &widen(&b));
    }
    let log = calls.lock().unwrap();
    assert!(!log.is_empty(), "the hooks were never called");
    assert!(log.iter().any(|c| c.starts_with("all_reduce")), "no all-reduce in {log:?}");
}

#[test]
fn a_failing_or_panicking_hook_is_a_callback_error() {
    let ctx = Context::new().unwrap();
    let hooks = CommHooks::new(
        0,
        1,
        |_| Err("link down".to_owned()),
        |_| Err("link down".to_owned()),
        |_| panic!("reduce panicked"),
        |_, _| Err("link down".to_owned()),
    );
    let comm = Comm::from_hooks(&ctx, &CommConfig::new(), hooks).unwrap();
    let par = ParallelConfig { dp: Some(&comm), edp: Some(&comm), ..Default::default() };
    let mut layer = Layer::new_parallel(&ctx, &fixture_config(), &par).unwrap();
    train_once(&mut layer);
    let err = layer.reduce_grads().unwrap_err();
    assert_eq!(err.status(), Status::Callback);
    assert!(err.message().contains("reduce panicked"), "message: {}", err.message());
}

#[test]
fn bad_hooks_are_rejected_and_freed() {
    let ctx = Context::new().unwrap();
    let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    struct Flag(Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let flag = Flag(dropped.clone());
    let hooks = CommHooks::new(3, 2, move |_| { let _ = &flag; Ok(()) }, |_| Ok(()), |_| Ok(()), |_, _| Ok(()));
    let err = Comm::from_hooks(&ctx, &CommConfig::new(), hooks).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("rank"), "message: {}", err.message());
    assert_eq!(dropped.load(SeqCst), 1, "the rejected hooks' closures were not freed");
}
