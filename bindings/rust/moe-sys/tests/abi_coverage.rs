//! moe-sys covers abi/moe.h: every MOE_API function is declared with the same number of
//! parameters, and every constant exists with the value the C compiler gives it.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use moe_sys::*;

const HEADER: &str = include_str!("../../../../abi/moe.h");
const FUNCTIONS_RS: &str = include_str!("../src/functions.rs");

/// name -> parameter count of every `MOE_API <ret> name(...);` (a `(void)` list counts 0).
fn c_functions() -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (i, _) in HEADER.match_indices("MOE_API ") {
        let decl = &HEADER[i..];
        let open = decl.find('(').unwrap();
        if decl[..open].contains('\n') || decl[..open].contains("__") {
            continue; // the #define lines of MOE_API itself
        }
        let name = decl[..open].rsplit(|c: char| c == ' ' || c == '*').next().unwrap();
        let close = decl.find(");").unwrap();
        let params = decl[open + 1..close].trim();
        let n = if params == "void" { 0 } else { params.split(',').count() };
        m.insert(name.to_owned(), n);
    }
    m
}

fn rust_functions() -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (i, _) in FUNCTIONS_RS.match_indices("pub fn ") {
        let decl = &FUNCTIONS_RS[i + 7..];
        let open = decl.find('(').unwrap();
        let close = decl.find(')').unwrap();
        let n = decl[open + 1..close].split(',').filter(|p| !p.trim().is_empty()).count();
        m.insert(decl[..open].to_owned(), n);
    }
    m
}

#[test]
fn every_function_is_declared_with_its_arity() {
    let c = c_functions();
    let rust = rust_functions();
    assert!(c.len() >= 60, "parsed only {} functions from abi/moe.h", c.len());
    assert_eq!(c, rust, "abi/moe.h (left) and moe-sys functions.rs (right) differ");
}

macro_rules! constants {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $name as i128)),*]
    };
}

fn rust_constants() -> Vec<(&'static str, i128)> {
    constants![
        MOE_OK, MOE_ERR_INVALID_ARGUMENT, MOE_ERR_UNSUPPORTED, MOE_ERR_OUT_OF_MEMORY, MOE_ERR_VERSION,
        MOE_ERR_STATE, MOE_ERR_NONFINITE, MOE_ERR_BACKEND, MOE_ERR_COMM, MOE_ERR_TIMEOUT, MOE_ERR_CALLBACK,
        MOE_ERR_INTERNAL, MOE_LOG_ERROR, MOE_LOG_WARN, MOE_LOG_INFO, MOE_LOG_DEBUG, MOE_DEVICE_CPU,
        MOE_DEVICE_CUDA, MOE_MEM_WEIGHTS, MOE_MEM_GRADS, MOE_MEM_ACTIVATIONS, MOE_MEM_WORKSPACE, MOE_MEM_COMM, MOE_MEM_HOST,
        MOE_MEM_NUM_CATEGORIES, MOE_ACT_SWIGLU, MOE_ACT_GEGLU, MOE_ACT_GELU, MOE_ACT_RELU, MOE_ACT_SILU,
        MOE_SCORE_SOFTMAX, MOE_SCORE_SOFTMAX_PRE_TOPK, MOE_SCORE_SIGMOID, MOE_SCORE_SQRTSOFTPLUS, MOE_AUX_NONE,
        MOE_AUX_SWITCH, MOE_AUX_SEQUENCE, MOE_AUX_GLOBAL, MOE_DROP_PROBS, MOE_DROP_POSITION, MOE_DTYPE_FP32,
        MOE_DTYPE_BF16, MOE_DTYPE_FP64, MOE_NONFINITE_REJECT, MOE_NONFINITE_PROPAGATE, MOE_GRAPHS_AUTO,
        MOE_GRAPHS_OFF, MOE_LAYER_RECOMPUTE_EXPERT_FC1, MOE_LAYER_RECOMPUTE_ROUTER,
        MOE_LAYER_RECOMPUTE_EXPERT_MLP, MOE_LAYER_OFFLOAD_EXPERT_FC1, MOE_LAYER_OFFLOAD_EXPERT_INPUT,
        MOE_LAYER_OFFLOAD_ROUTER, MOE_LAYER_OFFLOAD_INPUT, MOE_QUANT_NONE, MOE_QUANT_FP8_TENSORWISE,
        MOE_QUANT_FP8_BLOCKWISE, MOE_QUANT_MXFP8, MOE_QUANT_NVFP4, MOE_LAYER_FP8_STORE_EXPERT_FC1,
        MOE_LAYER_FP8_STORE_EXPERT_INPUT, MOE_MEM_OFFLOAD, MOE_PARAM_ROUTER_WEIGHT,
        MOE_PARAM_EXPERT_FC1, MOE_PARAM_EXPERT_FC2, MOE_PARAM_SHARED_FC1, MOE_PARAM_SHARED_FC2,
        MOE_PARAM_SHARED_GATE, MOE_PARAM_EXPERT_BIAS, MOE_PARAM_NUM_SLOTS, MOE_GRAD_ACCUMULATE, MOE_GRAD_OVERWRITE,
        MOE_STEP_TRAIN, MOE_STEP_EVAL, MOE_STEP_RECOMPUTE, MOE_STEP_EXPLICIT_AUX_SCALE, MOE_ROUTING_EXPERT_INDICES, MOE_ROUTING_PROBS,
        MOE_ROUTING_TOKENS_PER_EXPERT, MOE_ROUTING_KEPT_PER_EXPERT, MOE_ROUTING_DROPPED_MASK, MOE_COMM_SELF,
        MOE_COMM_MPI, MOE_COMM_NCCL, MOE_COMM_HOOKS, MOE_DTYPE_INT64, MOE_GROUP_TP, MOE_GROUP_CP, MOE_GROUP_DP,
        MOE_GROUP_PP, MOE_GROUP_ETP, MOE_GROUP_EP, MOE_GROUP_EDP, MOE_GROUP_DP_CP, MOE_GROUP_TP_CP,
        MOE_GROUP_TP_CP_DP, MOE_GROUP_NUM, MOE_DISPATCHER_ALL_TO_ALL, MOE_DISPATCHER_ALL_GATHER,
        MOE_COMBINE_WEIGHTED, MOE_COMBINE_UNWEIGHTED, MOE_VERSION_MAJOR, MOE_VERSION_MINOR, MOE_VERSION_PATCH,
        MOE_VERSION_NUMBER, MOE_API_VERSION, MOE_FEATURE_CPU, MOE_FEATURE_OPENMP, MOE_FEATURE_OPENBLAS,
        MOE_FEATURE_ONEDNN, MOE_FEATURE_BF16, MOE_FEATURE_FP64, MOE_FEATURE_CUDA, MOE_FEATURE_NCCL,
        MOE_FEATURE_MPI, MOE_FEATURE_FP8, MOE_PLAN_ATTN_GQA, MOE_PLAN_ATTN_MLA, MOE_RECOMPUTE_NONE,
        MOE_RECOMPUTE_SELECTIVE, MOE_RECOMPUTE_FULL, MOE_OFFLOAD_OPTIMIZER, MOE_OFFLOAD_ACTIVATIONS, MOE_PLAN_WEIGHTS,
        MOE_PLAN_GRADS, MOE_PLAN_OPTIMIZER, MOE_PLAN_ACTIVATIONS, MOE_PLAN_COMM_BUFFERS, MOE_PLAN_WORKSPACE,
        MOE_PLAN_NUM_CATEGORIES, MOE_PLAN_COMM_EP, MOE_PLAN_COMM_TP, MOE_PLAN_COMM_CP, MOE_PLAN_COMM_DP,
        MOE_PLAN_COMM_EDP, MOE_PLAN_COMM_PP, MOE_PLAN_COMM_NUM, MOE_STRUCT_CONTEXT_CONFIG, MOE_STRUCT_ALLOCATOR,
        MOE_STRUCT_LOGGER, MOE_STRUCT_PROFILER, MOE_STRUCT_MEMORY_STATS, MOE_STRUCT_LAYER_CONFIG, MOE_STRUCT_STEP_CONFIG,
        MOE_STRUCT_ROUTING_STATS, MOE_STRUCT_COMM_CONFIG, MOE_STRUCT_COMM_HOOKS, MOE_STRUCT_LAYOUT_CONFIG,
        MOE_STRUCT_PARALLEL_CONFIG, MOE_STRUCT_DISPATCHER_CONFIG, MOE_STRUCT_PLAN_MODEL, MOE_STRUCT_PLAN_PARALLEL,
        MOE_STRUCT_PLAN_RESULT, MOE_ENUM_FAMILY, MOE_ENUM_STATUS, MOE_ENUM_FEATURE, MOE_ENUM_LOG_LEVEL, MOE_ENUM_DEVICE,
        MOE_ENUM_MEM, MOE_ENUM_ACTIVATION, MOE_ENUM_SCORE, MOE_ENUM_AUX, MOE_ENUM_DROP, MOE_ENUM_DTYPE,
        MOE_ENUM_NONFINITE, MOE_ENUM_GRAPHS, MOE_ENUM_LAYER_RECOMPUTE, MOE_ENUM_LAYER_OFFLOAD, MOE_ENUM_QUANT,
        MOE_ENUM_LAYER_FP8_STORE, MOE_ENUM_PARAM, MOE_ENUM_GRAD_MODE, MOE_ENUM_STEP_MODE, MOE_ENUM_STEP_FLAG,
        MOE_ENUM_ROUTING, MOE_ENUM_COMM, MOE_ENUM_GROUP, MOE_ENUM_DISPATCHER, MOE_ENUM_COMBINE, MOE_ENUM_PLAN_ATTN,
        MOE_ENUM_PLAN_RECOMPUTE, MOE_ENUM_PLAN_OFFLOAD, MOE_ENUM_PLAN_CATEGORY, MOE_ENUM_PLAN_COMM, MOE_ENUM_STRUCT,
        MOE_ENUM_NONFINITE_KIND, MOE_STRUCT_NONFINITE_REPORT, MOE_NONFINITE_KIND_NONE, MOE_NONFINITE_KIND_NAN,
        MOE_NONFINITE_KIND_POS_INF, MOE_NONFINITE_KIND_NEG_INF, MOE_ERR_IO, MOE_STRUCT_STATE_ENTRY,
        MOE_STRUCT_CHECKPOINT_CONFIG, MOE_ENUM_STATE, MOE_ENUM_CHECKPOINT, MOE_STATE_PARAM, MOE_STATE_GRAD,
        MOE_STATE_ACCUMULATOR, MOE_STATE_COMPANION, MOE_CHECKPOINT_GRADS, MOE_CHECKPOINT_CAST,
        MOE_CHECKPOINT_RESET_ACCUMULATORS, MOE_STRUCT_MERGED_STEP, MOE_ENUM_MERGED, MOE_MERGED_DEFER_WEIGHT_GRADS,
        MOE_COMM_MODELED
    ]
}

/// Every MOE_* enum constant and numeric #define of the header.
fn header_constant_names() -> Vec<String> {
    let mut names = Vec::new();
    for line in HEADER.lines() {
        let mut rest = line;
        while let Some(i) = rest.find("MOE_") {
            let tail = &rest[i..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            let name = &tail[..end];
            let after = tail[end..].trim_start();
            let is_define = line.trim_start().starts_with("#define ") && line.contains(&format!("#define {name} "));
            if (after.starts_with('=') && !after.starts_with("==")) || is_define {
                if name != "MOE_API" && !names.iter().any(|n| n == name) {
                    names.push(name.to_owned());
                }
            }
            rest = &tail[end..];
        }
    }
    names
}

#[test]
fn every_constant_exists_with_the_c_value() {
    let rust = rust_constants();
    let header = header_constant_names();
    let missing: Vec<_> = header.iter().filter(|n| !rust.iter().any(|(r, _)| r == n)).collect();
    assert!(missing.is_empty(), "constants of abi/moe.h missing from this test (and maybe moe-sys): {missing:?}");
    assert_eq!(rust.len(), header.len());

    let mut prog = String::from("#include <stdio.h>\n#include \"moe.h\"\nint main(void)\n{\n");
    for (name, _) in &rust {
        prog.push_str(&format!("    printf(\"{name} %lld\\n\", (long long)({name}));\n"));
    }
    prog.push_str("    return 0;\n}\n");
    let abi = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../abi");
    let dir = std::env::temp_dir().join(format!("moe-sys-consts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("c.c"), prog).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-std=c11", "-I"])
        .arg(&abi)
        .arg(dir.join("c.c"))
        .arg("-o")
        .arg(dir.join("c"))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
    assert!(st.success());
    let out = Command::new(dir.join("c")).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let c: BTreeMap<String, i128> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect();
    for (name, value) in &rust {
        assert_eq!(Some(value), c.get(*name), "{name}: rust {value}, C {:?}", c.get(*name));
    }
}
