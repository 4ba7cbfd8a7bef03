//! Checkpoints (moe.h "checkpoints", docs/checkpoints.md): the layer's state dictionary, companions
//! (the host optimizer's per-parameter tensors, saved and resharded with their slot), and save / load
//! of safetensors files, one per rank, onto any EP x ETP layout.
use std::any::Any;
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};

use moe_sys as sys;

use crate::comm::Comm;
use crate::config::{c_enum, init_ok, Param};
use crate::error::{Error, Result, Status};
use crate::layer::Layer;
use crate::tensor::Element;

c_enum!(
    /// What a state-dictionary entry is (`MOE_STATE_*`).
    StateKind { Param = sys::MOE_STATE_PARAM, Grad = sys::MOE_STATE_GRAD, Accumulator = sys::MOE_STATE_ACCUMULATOR,
                Companion = sys::MOE_STATE_COMPANION });

/// One named tensor of the layer's state and the box of it this rank holds, cut in `view_shape`
/// (the global shape, except the gated expert FC1 viewed as [E, 2, F, H]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    pub name: String,
    pub kind: StateKind,
    /// the slot it is or follows; `None` for accumulators
    pub slot: Option<Param>,
    /// `MOE_DTYPE_*` as stored
    pub dtype: i32,
    /// the single-rank layer's shape
    pub shape: Vec<i64>,
    pub view_shape: Vec<i64>,
    pub offset: Vec<i64>,
    pub length: Vec<i64>,
}

fn slot_of(code: i32) -> Option<Param> {
    [Param::RouterWeight, Param::ExpertFc1, Param::ExpertFc2, Param::SharedFc1, Param::SharedFc2, Param::SharedGate,
     Param::ExpertBias]
        .into_iter()
        .find(|p| p.code() == code)
}

impl StateEntry {
    fn from_raw(e: &sys::moe_state_entry) -> StateEntry {
        let kind = [StateKind::Param, StateKind::Grad, StateKind::Accumulator, StateKind::Companion]
            .into_iter()
            .find(|k| k.code() == e.kind)
            .unwrap_or(StateKind::Param);
        let name = unsafe { CStr::from_ptr(e.name.as_ptr()) }.to_string_lossy().into_owned();
        let (n, v) = (e.ndim.clamp(0, 4) as usize, e.view_ndim.clamp(0, 4) as usize);
        StateEntry {
            name,
            kind,
            slot: slot_of(e.slot),
            dtype: e.dtype,
            shape: e.shape[..n].to_vec(),
            view_shape: e.view_shape[..v].to_vec(),
            offset: e.offset[..v].to_vec(),
            length: e.length[..v].to_vec(),
        }
    }
}

/// Where and how `Layer::save` / `Layer::load` work (`moe_checkpoint_config`).
#[derive(Debug, Clone)]
pub struct CheckpointConfig<'a> {
    dir: PathBuf,
    name: Option<String>,
    comm: Option<&'a Comm>,
    flags: i32,
}

impl<'a> CheckpointConfig<'a> {
    /// A checkpoint in directory `dir` (save creates it, one level), file stem "moe".
    pub fn new(dir: impl AsRef<Path>) -> CheckpointConfig<'a> {
        CheckpointConfig { dir: dir.as_ref().to_path_buf(), name: None, comm: None, flags: 0 }
    }
    /// The file stem, so that several layers share a directory.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }
    /// Every rank that saves (loads) together; without it, this rank alone.
    pub fn comm(mut self, comm: &'a Comm) -> Self {
        self.comm = Some(comm);
        self
    }
    fn flag(mut self, bit: i32, on: bool) -> Self {
        self.flags = if on { self.flags | bit } else { self.flags & !bit };
        self
    }
    /// Save and load the gradients too.
    pub fn grads(self, on: bool) -> Self {
        self.flag(sys::MOE_CHECKPOINT_GRADS, on)
    }
    /// Load: allow dtype changes that round (fp32 -> bf16, fp64 -> fp32).
    pub fn cast(self, on: bool) -> Self {
        self.flag(sys::MOE_CHECKPOINT_CAST, on)
    }
    /// Load: zero the per-rank accumulators instead of requiring the saved rank count.
    pub fn reset_accumulators(self, on: bool) -> Self {
        self.flag(sys::MOE_CHECKPOINT_RESET_ACCUMULATORS, on)
    }
}

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Status::InvalidArgument, format!("{what} holds a NUL byte")))
}

/// A host tensor attached to a slot: the binding owns its memory, the C layer its pointer.
pub(crate) struct Companion {
    pub(crate) slot: Param,
    pub(crate) name: CString,
    data: Box<dyn Any + Send>,
}

impl Layer {
    /// The layer's state dictionary, in the engine's order (`grads`: with the gradients).
    pub fn state_dict(&self, grads: bool) -> Result<Vec<StateEntry>> {
        let flags = if grads { sys::MOE_CHECKPOINT_GRADS } else { 0 };
        let mut n = 0i32;
        self.call(|l| unsafe { sys::moe_layer_state_count(l, flags, &mut n) })?;
        (0..n)
            .map(|i| {
                let mut e = sys::moe_state_entry::default();
                init_ok(unsafe { sys::moe_state_entry_init(&mut e, std::mem::size_of::<sys::moe_state_entry>()) })?;
                self.call(|l| unsafe { sys::moe_layer_state_entry(l, flags, i, &mut e) })?;
                Ok(StateEntry::from_raw(&e))
            })
            .collect()
    }

    /// Attaches `data` (the slot's local shape, row-major, any element type the engine stores:
    /// f32, Bf16, f64) to `slot` under `name`; the layer owns it from now on, and save / load read
    /// and write it like the slot. Read and change it with `companion` / `companion_mut`.
    pub fn attach_state<T: Element>(&mut self, slot: Param, name: &str, data: Vec<T>) -> Result<()> {
        let shape: Vec<i64> = self.param(slot)?.shape().iter().map(|&d| d as i64).collect();
        let cname = c_string(name, "name")?;
        let mut boxed: Box<[T]> = data.into_boxed_slice();
        let t = sys::DLTensor {
            data: boxed.as_mut_ptr() as *mut c_void,
            device: sys::DLDevice { device_type: sys::kDLCPU, device_id: 0 },
            ndim: shape.len() as i32,
            dtype: T::DTYPE,
            shape: shape.as_ptr() as *mut i64,
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let expected: i64 = shape.iter().product();
        if boxed.len() as i64 != expected {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("attach_state: data holds {} elements; the slot's local shape {shape:?} has {expected}", boxed.len()),
            ));
        }
        self.call(|l| unsafe { sys::moe_layer_attach_state(l, slot.code(), cname.as_ptr(), &t) })?;
        self.companions.push(Companion { slot, name: cname, data: Box::new(boxed) });
        Ok(())
    }

    fn find_companion(&self, slot: Param, name: &str) -> Option<usize> {
        self.companions.iter().position(|c| c.slot == slot && c.name.as_bytes() == name.as_bytes())
    }

    /// Detaches a companion and gives its data back.
    pub fn detach_state<T: Element>(&mut self, slot: Param, name: &str) -> Result<Vec<T>> {
        let i = self.find_companion(slot, name).ok_or_else(|| {
            Error::new(Status::InvalidArgument, format!("detach_state: slot {slot:?} has no companion named {name:?}"))
        })?;
        if !self.companions[i].data.is::<Box<[T]>>() {
            return Err(Error::new(Status::InvalidArgument, format!("detach_state: {name:?} holds another element type")));
        }
        let cname = self.companions[i].name.clone();
        self.call(|l| unsafe { sys::moe_layer_detach_state(l, slot.code(), cname.as_ptr()) })?;
        let c = self.companions.remove(i);
        Ok(c.data.downcast::<Box<[T]>>().map(|b| b.into_vec()).unwrap_or_default())
    }

    /// A companion's data (None: no such companion, or another element type).
    pub fn companion<T: Element>(&self, slot: Param, name: &str) -> Option<&[T]> {
        let i = self.find_companion(slot, name)?;
        self.companions[i].data.downcast_ref::<Box<[T]>>().map(|b| &b[..])
    }

    /// A companion's data, to change (the host optimizer's step writes its moments here).
    pub fn companion_mut<T: Element>(&mut self, slot: Param, name: &str) -> Option<&mut [T]> {
        let i = self.find_companion(slot, name)?;
        self.companions[i].data.downcast_mut::<Box<[T]>>().map(|b| &mut b[..])
    }

    fn checkpoint(&mut self, cfg: &CheckpointConfig<'_>, save: bool) -> Result<()> {
        let dir = c_string(&cfg.dir.to_string_lossy(), "dir")?;
        let name = cfg.name.as_deref().map(|n| c_string(n, "name")).transpose()?;
        let mut c: sys::moe_checkpoint_config = unsafe { std::mem::zeroed() };
        init_ok(unsafe { sys::moe_checkpoint_config_init(&mut c, std::mem::size_of::<sys::moe_checkpoint_config>()) })?;
        c.dir = dir.as_ptr();
        c.name = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
        c.comm = cfg.comm.map_or(std::ptr::null_mut(), |m| m.raw());
        c.flags = cfg.flags;
        self.call(|l| unsafe { if save { sys::moe_layer_save(l, &c) } else { sys::moe_layer_load(l, &c) } })
    }

    /// Writes this rank's state and (with the other ranks of `cfg.comm`) commits the checkpoint.
    pub fn save(&mut self, cfg: &CheckpointConfig<'_>) -> Result<()> {
        self.checkpoint(cfg, true)
    }

    /// Loads a checkpoint saved on any layout; on any error (on any rank) nothing changes.
    pub fn load(&mut self, cfg: &CheckpointConfig<'_>) -> Result<()> {
        self.checkpoint(cfg, false)
    }
}
