//! Struct layout against the C compiler: sizes, alignments and every field offset of every struct
//! in abi/moe.h and the DLPack types. The test writes a C program that prints the same numbers
//! (sizeof / _Alignof / offsetof), compiles it with `$CC` (default `cc`) against abi/moe.h and compares.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use moe_sys::*;

/// (struct name, [(field or "" for the struct itself, value)]) for size, alignment and offsets.
struct Layout {
    name: &'static str,
    size: usize,
    align: usize,
    offsets: Vec<(&'static str, usize)>,
}

macro_rules! layout {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        Layout {
            name: stringify!($ty),
            size: std::mem::size_of::<$ty>(),
            align: std::mem::align_of::<$ty>(),
            offsets: vec![$((stringify!($field), std::mem::offset_of!($ty, $field))),*],
        }
    };
}

fn rust_layouts() -> Vec<Layout> {
    vec![
        layout!(DLDevice { device_type, device_id }),
        layout!(DLDataType { code, bits, lanes }),
        layout!(DLTensor { data, device, ndim, dtype, shape, strides, byte_offset }),
        layout!(DLManagedTensor { dl_tensor, manager_ctx, deleter }),
        layout!(moe_allocator { struct_size, reserved, user_data, alloc, free, release }),
        layout!(moe_logger { struct_size, max_level, user_data, log, release }),
        layout!(moe_profiler { struct_size, reserved, user_data, range_push, range_pop, release }),
        layout!(moe_context_config {
            struct_size, api_version, next, device_type, device_id, num_threads, reserved0, allocator, logger, profiler
        }),
        layout!(moe_memory_stats {
            struct_size, reserved, current_bytes, peak_bytes, total_current_bytes, total_peak_bytes, num_allocations,
            cached_bytes, reserved_bytes, peak_reserved_bytes, device_allocations, trims
        }),
        layout!(moe_layer_config {
            struct_size, api_version, next, hidden_size, ffn_hidden_size, num_experts, top_k, activation,
            score_function, num_groups, group_topk, scaling_factor, expert_bias, bias_update_rate, aux_loss_type,
            aux_loss_coeff, seq_length, z_loss_coeff, capacity_factor, drop_policy, pad_to_capacity,
            shared_ffn_hidden_size, shared_gate, param_dtype, nonfinite_policy, reserved0, seed, graphs, recompute,
            offload, quant_recipe, fp8_storage, reserved3
        }),
        layout!(moe_step_config { struct_size, api_version, next, mode, aux_loss_scale, flags, reserved0 }),
        layout!(moe_merged_step {
            struct_size, api_version, next, forward_step, x, y, backward_step, dy, dx, weights_step, flags, reserved0
        }),
        layout!(moe_routing_stats {
            struct_size, reserved, num_tokens, num_assignments, dropped, padded_rows, capacity, aux_loss, z_loss,
            quant_saturated
        }),
        layout!(moe_comm_config { struct_size, api_version, next, timeout_ms, reserved0 }),
        layout!(moe_comm_hooks {
            struct_size, rank, size, reserved0, user_data, all_to_all_v, all_gather_v, all_reduce, broadcast,
            barrier, release
        }),
        layout!(moe_layout_config { struct_size, api_version, next, world_size, tp, cp, dp, pp, etp, ep, order }),
        layout!(moe_parallel_config {
            struct_size, api_version, next, ep_comm, etp_comm, aux_comm, edp_comm, dp_comm, bias_comm, dispatcher,
            num_chunks
        }),
        layout!(moe_dispatcher_config {
            struct_size, api_version, next, kind, dtype, hidden, num_experts, top_k, capacity_factor, drop_policy,
            pad_to_capacity, combine, reserved0
        }),
        layout!(moe_plan_model {
            struct_size, api_version, next, num_layers, first_dense_layers, moe_layer_freq, num_experts, top_k,
            num_shared_experts, hidden_size, ffn_hidden_size, moe_ffn_hidden_size, shared_ffn_hidden_size, vocab_size,
            activation, tied_embeddings, attention, num_heads, num_kv_heads, head_dim, q_lora_rank, kv_lora_rank,
            qk_rope_head_dim, v_head_dim
        }),
        layout!(moe_plan_parallel {
            struct_size, api_version, next, tp, cp, dp, pp, vpp, ep, etp, micro_batch, seq_length, num_micro_batches,
            param_bytes, grad_bytes, optimizer_bytes, activation_bytes, distributed_optimizer, recompute, offload,
            device_memory_bytes
        }),
        layout!(moe_plan_result {
            struct_size, stage, bytes, total_bytes, device_memory_bytes, fits, reserved, comm_bytes, params_total,
            params_per_gpu
        }),
        layout!(moe_nonfinite_report {
            struct_size, first_slot, num_nonfinite, num_nan, num_experts, num_slots, first_expert, first_kind,
            first_index
        }),
        layout!(moe_state_entry {
            struct_size, kind, slot, dtype, ndim, view_ndim, shape, view_shape, offset, length, name
        }),
        layout!(moe_checkpoint_config { struct_size, api_version, next, dir, name, comm, flags, reserved0 }),
    ]
}

/// "key value" lines, the format the C program prints.
fn rust_table(layouts: &[Layout]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in layouts {
        m.insert(format!("sizeof {}", l.name), l.size);
        m.insert(format!("alignof {}", l.name), l.align);
        for (f, o) in &l.offsets {
            m.insert(format!("offsetof {}.{}", l.name, f), *o);
        }
    }
    m
}

fn c_program(layouts: &[Layout]) -> String {
    let mut s = String::from("#include <stddef.h>\n#include <stdio.h>\n#include \"moe.h\"\nint main(void)\n{\n");
    for l in layouts {
        let n = l.name;
        writeln!(s, "    printf(\"sizeof {n} %zu\\n\", sizeof({n}));").unwrap();
        writeln!(s, "    printf(\"alignof {n} %zu\\n\", (size_t)_Alignof({n}));").unwrap();
        for (f, _) in &l.offsets {
            writeln!(s, "    printf(\"offsetof {n}.{f} %zu\\n\", offsetof({n}, {f}));").unwrap();
        }
    }
    s.push_str("    return 0;\n}\n");
    s
}

fn c_table(program: &str) -> BTreeMap<String, usize> {
    let abi = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../abi");
    let dir = std::env::temp_dir().join(format!("moe-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, program).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&abi)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
    assert!(out.status.success(), "compiling the layout probe failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().expect("running the layout probe");
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (k, v) = line.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn struct_layouts_match_the_c_compiler() {
    let layouts = rust_layouts();
    let rust = rust_table(&layouts);
    let c = c_table(&c_program(&layouts));
    assert_eq!(rust.len(), c.len());
    let diffs: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: rust {v}, C {:?}", c.get(k)))
        .collect();
    assert!(diffs.is_empty(), "layout differences:\n{}", diffs.join("\n"));
    // the config structs the engine reads by struct_size: spot values a reader can check by eye
    assert_eq!(rust["sizeof moe_layer_config"], c["sizeof moe_layer_config"]);
    assert_eq!(rust["sizeof DLTensor"], 48);
}
