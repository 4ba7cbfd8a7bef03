//! `moe::struct_size`, `moe::enum_name`, `moe::enum_value`: the library's struct sizes equal this
//! binding's mirrors, and the names of the constants the safe API uses map both ways.
use std::mem::size_of;

use moe::sys;
use moe::{enum_name, enum_value, struct_size, Param, Status};

#[test]
fn struct_sizes_match_the_binding() {
    let mirrors = [
        (sys::MOE_STRUCT_CONTEXT_CONFIG, size_of::<sys::moe_context_config>()),
        (sys::MOE_STRUCT_ALLOCATOR, size_of::<sys::moe_allocator>()),
        (sys::MOE_STRUCT_LOGGER, size_of::<sys::moe_logger>()),
        (sys::MOE_STRUCT_PROFILER, size_of::<sys::moe_profiler>()),
        (sys::MOE_STRUCT_MEMORY_STATS, size_of::<sys::moe_memory_stats>()),
        (sys::MOE_STRUCT_LAYER_CONFIG, size_of::<sys::moe_layer_config>()),
        (sys::MOE_STRUCT_STEP_CONFIG, size_of::<sys::moe_step_config>()),
        (sys::MOE_STRUCT_ROUTING_STATS, size_of::<sys::moe_routing_stats>()),
        (sys::MOE_STRUCT_COMM_CONFIG, size_of::<sys::moe_comm_config>()),
        (sys::MOE_STRUCT_COMM_HOOKS, size_of::<sys::moe_comm_hooks>()),
        (sys::MOE_STRUCT_LAYOUT_CONFIG, size_of::<sys::moe_layout_config>()),
        (sys::MOE_STRUCT_PARALLEL_CONFIG, size_of::<sys::moe_parallel_config>()),
        (sys::MOE_STRUCT_DISPATCHER_CONFIG, size_of::<sys::moe_dispatcher_config>()),
        (sys::MOE_STRUCT_PLAN_MODEL, size_of::<sys::moe_plan_model>()),
        (sys::MOE_STRUCT_PLAN_PARALLEL, size_of::<sys::moe_plan_parallel>()),
        (sys::MOE_STRUCT_PLAN_RESULT, size_of::<sys::moe_plan_result>()),
        (sys::MOE_STRUCT_NONFINITE_REPORT, size_of::<sys::moe_nonfinite_report>()),
        (sys::MOE_STRUCT_STATE_ENTRY, size_of::<sys::moe_state_entry>()),
        (sys::MOE_STRUCT_CHECKPOINT_CONFIG, size_of::<sys::moe_checkpoint_config>()),
        (sys::MOE_STRUCT_MERGED_STEP, size_of::<sys::moe_merged_step>()),
    ];
    for (kind, size) in mirrors {
        let s = struct_size(kind).unwrap();
        let name = enum_name(sys::MOE_ENUM_STRUCT, kind as i64).unwrap();
        assert_eq!(s.size, size, "{name}: library {} bytes, binding {size}", s.size);
        assert!(s.min_size <= s.size && s.min_size > 8, "{name}: min_size {}", s.min_size);
    }
    // the 0.1 layouts are the smallest accepted
    assert_eq!(struct_size(sys::MOE_STRUCT_LAYER_CONFIG).unwrap().min_size, 136);
    assert_eq!(struct_size(sys::MOE_STRUCT_ROUTING_STATS).unwrap().min_size, 64);
    let e = struct_size(sys::MOE_STRUCT_MERGED_STEP + 1).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("kind"), "{}", e.message());
}

#[test]
fn constant_names_both_ways() {
    let slots = [
        (Param::RouterWeight, "MOE_PARAM_ROUTER_WEIGHT"),
        (Param::ExpertFc1, "MOE_PARAM_EXPERT_FC1"),
        (Param::ExpertFc2, "MOE_PARAM_EXPERT_FC2"),
        (Param::SharedFc1, "MOE_PARAM_SHARED_FC1"),
        (Param::SharedFc2, "MOE_PARAM_SHARED_FC2"),
        (Param::SharedGate, "MOE_PARAM_SHARED_GATE"),
        (Param::ExpertBias, "MOE_PARAM_EXPERT_BIAS"),
    ];
    for (p, name) in slots {
        assert_eq!(enum_name(sys::MOE_ENUM_PARAM, p.code() as i64), Some(name));
        assert_eq!(enum_value(sys::MOE_ENUM_PARAM, name).unwrap(), p.code() as i64);
    }
    assert_eq!(enum_name(sys::MOE_ENUM_PARAM, sys::MOE_PARAM_NUM_SLOTS as i64), None);
    assert_eq!(enum_name(sys::MOE_ENUM_STEP_FLAG, 1), Some("MOE_STEP_EXPLICIT_AUX_SCALE"));
    assert_eq!(enum_name(sys::MOE_ENUM_FEATURE, sys::MOE_FEATURE_CUDA as i64), Some("MOE_FEATURE_CUDA"));
    assert_eq!(enum_name(sys::MOE_ENUM_STATUS, Status::Version.code() as i64), Some(Status::Version.name()));
    // every family lists itself, densely from 0
    let families: Vec<&str> = (0..).map_while(|f| enum_name(sys::MOE_ENUM_FAMILY, f)).collect();
    assert_eq!(families.len() as i32, sys::MOE_ENUM_MERGED + 1);
    assert_eq!(enum_name(sys::MOE_ENUM_MERGED, 1), Some("MOE_MERGED_DEFER_WEIGHT_GRADS"));
    assert_eq!(enum_name(sys::MOE_ENUM_COMM, sys::MOE_COMM_MODELED as i64), Some("MOE_COMM_MODELED"));
    assert_eq!(families[sys::MOE_ENUM_ACTIVATION as usize], "MOE_ENUM_ACTIVATION");
    let e = enum_value(sys::MOE_ENUM_ACTIVATION, "MOE_SCORE_SIGMOID").unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("MOE_SCORE_SIGMOID"), "{}", e.message());
    assert!(enum_value(sys::MOE_ENUM_ACTIVATION, "MOE_ACT\0GELU").is_err());
}
