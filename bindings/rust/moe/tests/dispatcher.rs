//! The standalone dispatcher on one rank, checked against the fixture's routing and closed forms.
mod common;

use common::*;
use moe::{Context, Dispatcher, DispatcherConfig, TensorMut, TensorRef};

#[test]
fn one_rank_dispatch_combine_backward() {
    let fx = Fixture::load();
    let ctx = Context::new().unwrap();
    let mut d = Dispatcher::new(&ctx, &DispatcherConfig::new(H, E, K), None).unwrap();
    assert_eq!(d.local_experts().unwrap(), (E, 0));
    let x = fx.get("x").f32();
    let idx: Vec<i64> = fx.get("expert_indices").values.iter().map(|&v| v as i64).collect();
    let probs = fx.get("probs").f32();
    let mut h = d
        .dispatch(
            &TensorRef::new(&x, &[T, H]).unwrap(),
            &TensorRef::new(&idx, &[T, K]).unwrap(),
            Some(&TensorRef::new(&probs, &[T, K]).unwrap()),
        )
        .unwrap();
    let info = h.info().unwrap();
    assert_eq!((info.num_rows, info.dropped, info.padded), ((T * K) as i64, 0, 0));
    let rx = T * K;
    let (mut x_rows, mut row_probs, mut tpe) = (vec![0f32; rx * H], vec![0f32; rx], vec![0i64; E]);
    h.rows(
        Some(&mut TensorMut::new(&mut x_rows, &[rx, H]).unwrap()),
        Some(&mut TensorMut::vector(&mut row_probs)),
        Some(&mut TensorMut::vector(&mut tpe)),
    )
    .unwrap();

    // expected: rows grouped by expert ascending, then token ascending
    let mut order = Vec::new(); // (token, k) per row
    for e in 0..E as i64 {
        for t in 0..T {
            for k in 0..K {
                if idx[t * K + k] == e {
                    order.push((t, k));
                }
            }
        }
    }
    let want_tpe: Vec<i64> = (0..E as i64).map(|e| idx.iter().filter(|&&i| i == e).count() as i64).collect();
    assert_eq!(tpe, want_tpe);
    let tpe_fx: Vec<i64> = fx.get("tokens_per_expert").values.iter().map(|&v| v as i64).collect();
    assert_eq!(tpe, tpe_fx);
    for (r, &(t, k)) in order.iter().enumerate() {
        assert_eq!(&x_rows[r * H..(r + 1) * H], &x[t * H..(t + 1) * H], "row {r} is not token {t}");
        assert_eq!(row_probs[r], probs[t * K + k]);
    }

    // combine of y_rows = 2 x_rows: y[t] = 2 * sum_k p_tk x[t]
    let y_rows: Vec<f32> = x_rows.iter().map(|v| 2.0 * v).collect();
    let mut y = vec![0f32; T * H];
    h.combine(&TensorRef::new(&y_rows, &[rx, H]).unwrap(), &mut TensorMut::new(&mut y, &[T, H]).unwrap()).unwrap();
    for t in 0..T {
        let p: f32 = probs[t * K..(t + 1) * K].iter().sum();
        let want: Vec<f64> = (0..H).map(|j| (2.0 * p * x[t * H + j]) as f64).collect();
        assert_close("y", &widen(&y[t * H..(t + 1) * H]), &want);
    }

    // combine backward: dy_rows = p * dy[t], d_row_probs = <dy[t], y_rows[row]>
    let dy = fx.get("dy").f32();
    let (mut dy_rows, mut d_row_probs) = (vec![0f32; rx * H], vec![0f32; rx]);
    h.combine_backward(
        &TensorRef::new(&dy, &[T, H]).unwrap(),
        &mut TensorMut::new(&mut dy_rows, &[rx, H]).unwrap(),
        Some(&mut TensorMut::vector(&mut d_row_probs)),
    )
    .unwrap();
    for (r, &(t, k)) in order.iter().enumerate() {
        let want: Vec<f64> = (0..H).map(|j| (probs[t * K + k] * dy[t * H + j]) as f64).collect();
        assert_close("dy_rows", &widen(&dy_rows[r * H..(r + 1) * H]), &want);
        let dot: f64 = (0..H).map(|j| dy[t * H + j] as f64 * y_rows[r * H + j] as f64).sum();
        assert!((d_row_probs[r] as f64 - dot).abs() <= 1e-5 + 1e-5 * dot.abs(), "d_row_probs[{r}]");
    }

    // backward: dx[t] = sum of t's rows; dprobs[t,k] = d_row_probs of (t,k)'s row
    let (mut dx, mut dprobs) = (vec![0f32; T * H], vec![0f32; T * K]);
    h.backward(
        &TensorRef::new(&dy_rows, &[rx, H]).unwrap(),
        Some(&TensorRef::vector(&d_row_probs)),
        &mut TensorMut::new(&mut dx, &[T, H]).unwrap(),
        Some(&mut TensorMut::new(&mut dprobs, &[T, K]).unwrap()),
    )
    .unwrap();
    for t in 0..T {
        let p: f32 = probs[t * K..(t + 1) * K].iter().sum();
        let want: Vec<f64> = (0..H).map(|j| (p * dy[t * H + j]) as f64).collect();
        assert_close("dx", &widen(&dx[t * H..(t + 1) * H]), &want);
    }
    for (r, &(t, k)) in order.iter().enumerate() {
        assert_eq!(dprobs[t * K + k], d_row_probs[r]);
    }
    drop(d); // the dispatch handle keeps its dispatcher alive
    assert_eq!(h.info().unwrap().num_rows, rx as i64);
}
