//! Merged forward/backward (moe.h "merged forward/backward"): the steady state of a 1F1B pipeline
//! runs the forward of micro-batch i+1 and the backward of micro-batch i as one call, each half's
//! expert-parallel exchanges in flight behind the other half's compute. Results are bitwise those
//! of the separate calls.
use moe_sys as sys;

use crate::config::init_ok;
use crate::device::Stream;
use crate::error::Result;
use crate::layer::Layer;
use crate::step::Step;
use crate::tensor::{AsTensor, AsTensorMut, Element};

/// The parts of one `Layer::forward_backward` call (`moe_merged_step`); a part left out is not run.
/// The steps are borrowed mutably, so one step cannot be given for two parts.
///
/// ```
/// # use moe::{Context, Layer, LayerConfig, MergedStep, StepConfig, TensorMut, TensorRef};
/// # let ctx = Context::new().unwrap();
/// # let mut layer = Layer::new(&ctx, &LayerConfig::new(8, 16, 4, 2)).unwrap();
/// let (x, dy) = (vec![0.5f32; 3 * 8], vec![0.25f32; 3 * 8]);
/// let (mut y0, mut y1, mut dx0) = (vec![0f32; 3 * 8], vec![0f32; 3 * 8], vec![0f32; 3 * 8]);
/// let (mut s0, mut s1) = (layer.step(&StepConfig::default()).unwrap(), layer.step(&StepConfig::default()).unwrap());
/// let xt = TensorRef::new(&x, &[3, 8]).unwrap();
/// layer.forward(&mut s0, &xt, &mut TensorMut::new(&mut y0, &[3, 8]).unwrap()).unwrap();
/// // forward of micro-batch 1 and backward of micro-batch 0, in one call
/// let (mut y1t, mut dx0t) = (TensorMut::new(&mut y1, &[3, 8]).unwrap(), TensorMut::new(&mut dx0, &[3, 8]).unwrap());
/// let dyt = TensorRef::new(&dy, &[3, 8]).unwrap();
/// layer
///     .forward_backward(MergedStep::new().forward(&mut s1, &xt, &mut y1t).backward(&mut s0, &dyt, &mut dx0t))
///     .unwrap();
/// ```
pub struct MergedStep<'a, T: Element> {
    forward: Option<(&'a mut Step, &'a dyn AsTensor<T>, &'a mut dyn AsTensorMut<T>)>,
    backward: Option<(&'a mut Step, &'a dyn AsTensor<T>, &'a mut dyn AsTensorMut<T>)>,
    weights: Option<&'a mut Step>,
    defer_weight_grads: bool,
}

impl<'a, T: Element> MergedStep<'a, T> {
    /// No parts yet (a call with none does nothing).
    pub fn new() -> Self {
        MergedStep { forward: None, backward: None, weights: None, defer_weight_grads: false }
    }

    /// The forward of the next micro-batch: as `Layer::forward(step, x, y)`.
    pub fn forward(mut self, step: &'a mut Step, x: &'a dyn AsTensor<T>, y: &'a mut dyn AsTensorMut<T>) -> Self {
        self.forward = Some((step, x, y));
        self
    }

    /// The backward of an earlier micro-batch: as `Layer::backward(step, dy, dx)`; `step` holds a
    /// training forward.
    pub fn backward(mut self, step: &'a mut Step, dy: &'a dyn AsTensor<T>, dx: &'a mut dyn AsTensorMut<T>) -> Self {
        self.backward = Some((step, dy, dx));
        self
    }

    /// A step whose weight gradients were deferred (an earlier call with `defer_weight_grads`, or
    /// `Layer::backward_data`): they are added in this call, in the gaps where both halves wait.
    pub fn weights(mut self, step: &'a mut Step) -> Self {
        self.weights = Some(step);
        self
    }

    /// `MOE_MERGED_DEFER_WEIGHT_GRADS`: the backward part runs its data half only; its step keeps
    /// the weight gradients pending for a later call's `weights` (or `Layer::backward_weights`).
    pub fn defer_weight_grads(mut self, on: bool) -> Self {
        self.defer_weight_grads = on;
        self
    }
}

impl<T: Element> Default for MergedStep<'_, T> {
    fn default() -> Self {
        MergedStep::new()
    }
}

impl Layer {
    /// Runs the parts of `args` as one call (`moe_layer_forward_backward`): y, dx, every gradient,
    /// the losses, routing statistics and expert counts are bitwise those of the separate calls
    /// `backward_weights(weights)`, `forward(forward...)`, `backward_data(backward...)` and, unless
    /// deferred, `backward_weights(backward step)`. Every argument is checked before anything runs.
    pub fn forward_backward<T: Element>(&mut self, args: MergedStep<'_, T>) -> Result<()> {
        self.forward_backward_on(args, Stream::DEFAULT)
    }

    /// `forward_backward`, ordered on `stream` (on CUDA, the forward half runs on a second stream
    /// of the layer, joined back into `stream` before the call returns).
    pub fn forward_backward_on<T: Element>(&mut self, args: MergedStep<'_, T>, stream: Stream) -> Result<()> {
        let MergedStep { forward, backward, weights, defer_weight_grads } = args;
        let mut m = std::mem::MaybeUninit::<sys::moe_merged_step>::zeroed();
        init_ok(unsafe { sys::moe_merged_step_init(m.as_mut_ptr(), std::mem::size_of::<sys::moe_merged_step>()) })?;
        let mut m = unsafe { m.assume_init() };
        // the DLTensors live here, in this frame, for the whole call; m points into them
        let mut fwd = forward.map(|(s, x, y)| (s.raw(), x.dl_in(), y.dl_out()));
        let mut bwd = backward.map(|(s, dy, dx)| (s.raw(), dy.dl_in(), dx.dl_out()));
        if let Some((s, x, y)) = fwd.as_mut() {
            m.forward_step = *s;
            m.x = x as *const sys::DLTensor;
            m.y = y as *mut sys::DLTensor;
        }
        if let Some((s, dy, dx)) = bwd.as_mut() {
            m.backward_step = *s;
            m.dy = dy as *const sys::DLTensor;
            m.dx = dx as *mut sys::DLTensor;
        }
        m.weights_step = weights.map_or(std::ptr::null_mut(), |s| s.raw());
        m.flags = if defer_weight_grads { sys::MOE_MERGED_DEFER_WEIGHT_GRADS } else { 0 };
        self.call(|l| unsafe { sys::moe_layer_forward_backward(l, &m, stream.as_raw()) })
    }
}
