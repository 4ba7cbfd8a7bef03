//! Adds moe-sys's library directories as an rpath of this crate's tests and examples
//! (cargo passes link arguments of a dependency's build script to that package only).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MOE_LIB_DIRS");
    if let Some(dirs) = std::env::var_os("DEP_MOE_LIB_DIRS") {
        for d in std::env::split_paths(&dirs) {
            if !d.as_os_str().is_empty() {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{}", d.display());
            }
        }
    }
}
