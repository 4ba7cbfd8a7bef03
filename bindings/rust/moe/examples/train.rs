//! Trains a small MoE layer to imitate a fixed random "teacher" MoE layer of the same shape, with
//! plain SGD applied through the exported parameter and gradient views. Prints a falling loss.
//!
//!   cargo run --example train [-- STEPS]
use moe::{Activation, Context, GradMode, Layer, LayerConfig, Param, Result, StepConfig, StepMode, TensorMut, TensorRef};

const T: usize = 64;
const H: usize = 16;
const F: usize = 32;
const E: usize = 4;
const K: usize = 2;

/// Deterministic inputs in [-1, 1) (an LCG: no crates).
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn config(seed: u64) -> LayerConfig {
    LayerConfig::new(H, F, E, K).activation(Activation::SwiGlu).seed(seed)
}

fn main() -> Result<()> {
    let steps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    let lr = 20.0f32; // the teacher's outputs are small (~0.03), so the loss and its gradients are too
    let ctx = Context::builder().num_threads(1).build()?;
    let mut teacher = Layer::new(&ctx, &config(1))?;
    let mut student = Layer::new(&ctx, &config(2))?;
    student.set_grad_mode(GradMode::Overwrite)?;
    let slots = [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2];
    // views stay valid across steps: they alias the layer's storage
    let mut params = slots.iter().map(|&s| student.param(s)).collect::<Result<Vec<_>>>()?;
    let grads = slots.iter().map(|&s| student.grad(s)).collect::<Result<Vec<_>>>()?;

    let x = inputs(T * H, 7);
    let mut target = vec![0f32; T * H];
    let mut eval = teacher.step(&StepConfig::new(StepMode::Eval))?;
    teacher.forward(&mut eval, &TensorRef::new(&x, &[T, H])?, &mut TensorMut::new(&mut target, &[T, H])?)?;

    let (mut y, mut dy, mut dx) = (vec![0f32; T * H], vec![0f32; T * H], vec![0f32; T * H]);
    let mut first = None;
    let mut last = 0.0;
    for it in 0..=steps {
        let mut step = student.step(&StepConfig::new(StepMode::Train))?;
        student.forward(&mut step, &TensorRef::new(&x, &[T, H])?, &mut TensorMut::new(&mut y, &[T, H])?)?;
        // mean squared error and its gradient
        let n = (T * H) as f32;
        let mut loss = 0.0f64;
        for ((d, &yi), &ti) in dy.iter_mut().zip(&y).zip(&target) {
            let r = yi - ti;
            loss += (r * r) as f64;
            *d = 2.0 * r / n;
        }
        loss /= n as f64;
        first.get_or_insert(loss);
        last = loss;
        if it % 25 == 0 {
            println!("step {it:4}  loss {loss:.6}");
        }
        if it == steps {
            break;
        }
        student.backward(&mut step, &TensorRef::new(&dy, &[T, H])?, &mut TensorMut::new(&mut dx, &[T, H])?)?;
        for (p, g) in params.iter_mut().zip(&grads) {
            let g = g.to_vec::<f32>()?;
            p.with_mut(|w: &mut [f32]| w.iter_mut().zip(&g).for_each(|(w, g)| *w -= lr * g))?;
        }
    }
    let first = first.unwrap_or(last);
    println!("initial_loss={first:.6} final_loss={last:.6}");
    if !(last < first) {
        eprintln!("train: the loss did not fall");
        std::process::exit(1);
    }
    Ok(())
}
