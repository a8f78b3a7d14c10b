//! Compiles the C shim with the flags of Open MPI's `mpicc` and links `libmpi` with an rpath, so
//! binaries run without `LD_LIBRARY_PATH`.
//!
//! `mpicc` is taken from `MPICC` when set, else from the project venv (`FTKV_VENV`, default
//! `<workspace>/.venv`) that `scripts/setup.sh` creates.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MPICC");
    println!("cargo:rerun-if-env-changed=FTKV_VENV");
    println!("cargo:rerun-if-changed=shim/shim.c");
    let mpicc = find_mpicc();
    let include_dirs = showme(&mpicc, "incdirs");
    let lib_dirs = showme(&mpicc, "libdirs");
    let libs = showme(&mpicc, "libs");
    compile_shim(&include_dirs);
    for dir in &lib_dirs {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    for lib in &libs {
        println!("cargo:rustc-link-lib={lib}");
    }
    // Crates that link binaries against this one read it as DEP_MPI_LIBDIRS for their rpath.
    println!("cargo:libdirs={}", lib_dirs.join(":"));
}

fn find_mpicc() -> PathBuf {
    if let Some(explicit) = std::env::var_os("MPICC") {
        return PathBuf::from(explicit);
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest.ancestors().nth(2).expect("crate lives in <workspace>/crates/");
    let venv = std::env::var_os("FTKV_VENV").map_or_else(|| workspace.join(".venv"), PathBuf::from);
    let candidate = venv.join("bin").join("mpicc");
    if !candidate.exists() {
        panic!(
            "mpicc not found at {}: run scripts/setup.sh (or set MPICC to Open MPI 5's mpicc)",
            candidate.display()
        );
    }
    candidate
}

fn showme(mpicc: &Path, what: &str) -> Vec<String> {
    let output = Command::new(mpicc)
        .arg(format!("-showme:{what}"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", mpicc.display()));
    assert!(output.status.success(), "{} -showme:{what} failed", mpicc.display());
    String::from_utf8_lossy(&output.stdout).split_whitespace().map(str::to_owned).collect()
}

fn compile_shim(include_dirs: &[String]) {
    let mut build = cc::Build::new();
    build.file("shim/shim.c").warnings(true);
    for dir in include_dirs {
        build.include(dir);
    }
    build.compile("ftkv_mpi_shim");
}
