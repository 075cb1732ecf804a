// Copies rustls-ffi's rustls.h (its build script names its directory:
// DEP_RUSTLS_FFI_INCLUDE) to where CMake reads it: TERN_RUSTLS_INCLUDE.
use std::{env, fs, path::PathBuf};

fn main() {
    let from = PathBuf::from(env::var("DEP_RUSTLS_FFI_INCLUDE").unwrap()).join("rustls.h");
    if let Ok(to) = env::var("TERN_RUSTLS_INCLUDE") {
        fs::create_dir_all(&to).unwrap();
        fs::copy(&from, PathBuf::from(to).join("rustls.h")).unwrap();
    }
    println!("cargo:rerun-if-env-changed=TERN_RUSTLS_INCLUDE");
}
