//! Finds libmoe.so: `MOE_LIB_DIR` (the directory holding it) first, else `pkg-config --libs-only-L moe`
//! (run as a subprocess: no build dependencies), else the linker's default paths.
use std::env;
use std::process::Command;

fn pkg_config_dirs() -> Option<Vec<String>> {
    let out = Command::new("pkg-config").args(["--libs-only-L", "moe"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.split_whitespace().filter_map(|w| w.strip_prefix("-L")).map(str::to_owned).collect())
}

fn main() {
    println!("cargo:rerun-if-env-changed=MOE_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let dirs = match env::var("MOE_LIB_DIR") {
        Ok(d) if !d.is_empty() => vec![d],
        _ => pkg_config_dirs().unwrap_or_else(|| {
            println!("cargo:warning=libmoe not found: set MOE_LIB_DIR or install moe.pc; trying the default paths");
            Vec::new()
        }),
    };
    for d in &dirs {
        println!("cargo:rustc-link-search=native={d}");
        // an rpath, so tests and examples run without LD_LIBRARY_PATH
        println!("cargo:rustc-link-arg=-Wl,-rpath,{d}");
    }
    println!("cargo:rustc-link-lib=dylib=moe");
    // `links = "moe"`: dependents read this as DEP_MOE_LIB_DIRS to add the same rpath
    println!("cargo:lib_dirs={}", env::join_paths(&dirs).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default());
}
