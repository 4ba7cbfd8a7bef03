//! An in-process collective library for ranks that are threads of one test: every collective is
//! one exchange round through a shared area (mutex + condvar), and `hooks` turns it into the
//! `CommHooks` of one rank. Any hook that fails (Err or panic) aborts the area, so the peers' hooks
//! fail too instead of waiting forever; a deadline catches a peer that never arrives.
#![allow(dead_code)]
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use moe::{AllGatherV, AllToAllV, CommHooks, HookResult, ReduceBuf};

struct Area {
    /// slots[src][dst]: the block src sends to dst in this round; None until src has posted
    slots: Vec<Option<Vec<Vec<u8>>>>,
    /// ranks that have read this round; the last one clears the slots for the next
    readers: usize,
    aborted: Option<String>,
    /// how long a rank waits for its peers in one round
    timeout: Duration,
}

pub struct Exchange {
    size: usize,
    area: Mutex<Area>,
    cv: Condvar,
}

impl Exchange {
    pub fn new(size: usize, timeout: Duration) -> Arc<Exchange> {
        let area = Area { slots: vec![None; size], readers: 0, aborted: None, timeout };
        Arc::new(Exchange { size, area: Mutex::new(area), cv: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, Area> {
        // a panicking hook never holds the lock, but a poisoned lock must not hide the real failure
        self.area.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every later round, on every rank, fails with `why`.
    pub fn abort(&self, why: &str) {
        let mut a = self.lock();
        if a.aborted.is_none() {
            a.aborted = Some(why.to_owned());
        }
        self.cv.notify_all();
    }

    /// Shortens (or lengthens) the wait of rounds already waiting too.
    pub fn set_timeout(&self, timeout: Duration) {
        self.lock().timeout = timeout;
        self.cv.notify_all();
    }

    pub fn aborted(&self) -> Option<String> {
        self.lock().aborted.clone()
    }

    fn wait<'g>(
        &self,
        mut a: MutexGuard<'g, Area>,
        rank: usize,
        start: Instant,
        ready: impl Fn(&Area) -> bool,
    ) -> Result<MutexGuard<'g, Area>, String> {
        loop {
            if let Some(why) = &a.aborted {
                return Err(format!("rank {rank}: exchange aborted ({why})"));
            }
            if ready(&a) {
                return Ok(a);
            }
            let (now, deadline) = (Instant::now(), start + a.timeout);
            if now >= deadline {
                let why = format!("rank {rank}: no peer after {:?}", a.timeout);
                a.aborted = Some(why.clone());
                self.cv.notify_all();
                return Err(why);
            }
            a = self.cv.wait_timeout(a, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// One round: `blocks[dst]` goes to rank dst; returns the block each rank sent to `rank`.
    pub fn round(&self, rank: usize, blocks: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, String> {
        assert_eq!(blocks.len(), self.size, "one block per rank");
        let start = Instant::now();
        let a = self.lock();
        // a fast rank may arrive before the slow one has read the previous round
        let mut a = self.wait(a, rank, start, |a| a.slots[rank].is_none())?;
        a.slots[rank] = Some(blocks);
        self.cv.notify_all();
        let mut a = self.wait(a, rank, start, |a| a.slots.iter().all(Option::is_some))?;
        let got = a.slots.iter().map(|s| s.as_ref().expect("posted")[rank].clone()).collect();
        a.readers += 1;
        if a.readers == self.size {
            a.slots.iter_mut().for_each(|s| *s = None);
            a.readers = 0;
            self.cv.notify_all();
        }
        Ok(got)
    }
}

/// Calls of one rank's hooks; "peer" calls moved at least one byte to or from another rank.
#[derive(Default)]
pub struct Counts {
    pub a2a: AtomicUsize,
    pub a2a_peer: AtomicUsize,
    pub ag: AtomicUsize,
    pub ag_peer: AtomicUsize,
    pub reduce: AtomicUsize,
}

/// An injected failure of a rank's all_to_all_v / all_gather_v hooks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fault {
    None,
    Err,
    Panic,
}

/// Aborts the exchange when a hook unwinds, so a panic reaches the peers like an Err does.
struct AbortOnUnwind<'a>(&'a Exchange);

impl Drop for AbortOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort("a peer's hook panicked");
        }
    }
}

fn guarded(ex: &Exchange, f: impl FnOnce() -> HookResult) -> HookResult {
    let _g = AbortOnUnwind(ex);
    f().map_err(|e| {
        ex.abort(&e);
        e
    })
}

fn inject(fault: Fault, rank: usize, hook: &str) -> HookResult {
    match fault {
        Fault::None => Ok(()),
        Fault::Err => Err(format!("rank {rank}: injected {hook} failure")),
        Fault::Panic => panic!("rank {rank}: injected {hook} panic"),
    }
}

/// Copies each rank's received block to its place, checking it has the announced size.
fn place(recv: &mut [u8], got: &[Vec<u8>], bytes: &[i64], offsets: &[i64]) -> HookResult {
    for (src, block) in got.iter().enumerate() {
        if block.len() as i64 != bytes[src] {
            return Err(format!("rank {src} sent {} bytes, {} expected", block.len(), bytes[src]));
        }
        let o = offsets[src] as usize;
        recv[o..o + block.len()].copy_from_slice(block);
    }
    Ok(())
}

/// Sums equal-length byte blocks of `T` in rank order (the same order on every rank: equal results).
fn sum_into<T: Copy + std::ops::Add<Output = T>, const N: usize>(
    buf: &mut [T],
    got: &[Vec<u8>],
    decode: fn([u8; N]) -> T,
) -> HookResult {
    for block in got {
        if block.len() != buf.len() * N {
            return Err(format!("all_reduce: a rank sent {} bytes, {} expected", block.len(), buf.len() * N));
        }
    }
    for (i, v) in buf.iter_mut().enumerate() {
        let at = |b: &Vec<u8>| decode(b[i * N..(i + 1) * N].try_into().expect("N bytes"));
        *v = got[1..].iter().fold(at(&got[0]), |acc, b| acc + at(b));
    }
    Ok(())
}

fn as_bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    // SAFETY: plain numbers (f32 / f64 / i64) read as their bytes
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }.to_vec()
}

/// Rank `rank` of `size`'s collectives over `ex`; `fault` breaks its all_to_all_v / all_gather_v.
pub fn hooks(rank: usize, size: usize, ex: Arc<Exchange>, counts: Arc<Counts>, fault: Fault) -> CommHooks {
    let (e1, e2, e3, e4, e5) = (ex.clone(), ex.clone(), ex.clone(), ex.clone(), ex);
    let (c1, c2, c3) = (counts.clone(), counts.clone(), counts);
    let peer_bytes = move |b: &[i64]| b.iter().enumerate().filter(|(r, _)| *r != rank).map(|(_, &n)| n).sum::<i64>();
    CommHooks::new(
        rank as i32,
        size as i32,
        move |a: AllToAllV<'_>| {
            guarded(&e1, || {
                inject(fault, rank, "all_to_all_v")?;
                c1.a2a.fetch_add(1, SeqCst);
                if peer_bytes(a.send_bytes) + peer_bytes(a.recv_bytes) > 0 {
                    c1.a2a_peer.fetch_add(1, SeqCst);
                }
                let blocks = (0..size)
                    .map(|d| {
                        let o = a.send_offsets[d] as usize;
                        a.send[o..o + a.send_bytes[d] as usize].to_vec()
                    })
                    .collect();
                let got = e1.round(rank, blocks)?;
                place(a.recv, &got, a.recv_bytes, a.recv_offsets)
            })
        },
        move |a: AllGatherV<'_>| {
            guarded(&e2, || {
                inject(fault, rank, "all_gather_v")?;
                c2.ag.fetch_add(1, SeqCst);
                if peer_bytes(a.recv_bytes) > 0 || (size > 1 && !a.send.is_empty()) {
                    c2.ag_peer.fetch_add(1, SeqCst);
                }
                let got = e2.round(rank, vec![a.send.to_vec(); size])?;
                place(a.recv, &got, a.recv_bytes, a.recv_offsets)
            })
        },
        move |b: ReduceBuf<'_>| {
            guarded(&e3, || {
                c3.reduce.fetch_add(1, SeqCst);
                match b {
                    ReduceBuf::F32(v) => {
                        let got = e3.round(rank, vec![as_bytes(v); size])?;
                        sum_into(v, &got, f32::from_ne_bytes)
                    }
                    ReduceBuf::F64(v) => {
                        let got = e3.round(rank, vec![as_bytes(v); size])?;
                        sum_into(v, &got, f64::from_ne_bytes)
                    }
                    ReduceBuf::I64(v) => {
                        let got = e3.round(rank, vec![as_bytes(v); size])?;
                        sum_into(v, &got, i64::from_ne_bytes)
                    }
                }
            })
        },
        move |buf: &mut [u8], root: i32| {
            guarded(&e4, || {
                let root = usize::try_from(root).ok().filter(|&r| r < size).ok_or(format!("broadcast root {root}"))?;
                let blocks = if rank == root { vec![buf.to_vec(); size] } else { vec![Vec::new(); size] };
                let got = e4.round(rank, blocks)?;
                if got[root].len() != buf.len() {
                    return Err(format!("broadcast: root sent {} bytes, {} expected", got[root].len(), buf.len()));
                }
                buf.copy_from_slice(&got[root]);
                Ok(())
            })
        },
    )
    .barrier(move || guarded(&e5, || e5.round(rank, vec![Vec::new(); size]).map(|_| ())))
}

/// Runs `f(rank)` for ranks 0 and 1 on two threads; their results in rank order.
pub fn two_ranks<R: Send>(f: impl Fn(usize) -> R + Sync) -> [R; 2] {
    std::thread::scope(|s| {
        let f = &f;
        let h1 = s.spawn(move || f(1));
        let r0 = f(0);
        let r1 = h1.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        [r0, r1]
    })
}
