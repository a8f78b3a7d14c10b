//! `examples/c/checkpoint.c`, built with the project venv's `mpicc` against `include/ftkv.h`
//! and the shared library, run under `mpirun --with-ft ulfm`: rank 1 SIGKILLs itself right
//! after its 10th checkpoint was acknowledged, the survivors recover, and rank 0 reads that
//! checkpoint back byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ftkv_launch::launch::Launch;

/// The directory cargo builds this profile's libraries into (`target/<profile>`).
fn profile_dir() -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    test.ancestors().nth(2).expect("target/<profile>/deps/<test>").to_path_buf()
}

fn mpicc(workspace: &Path) -> PathBuf {
    std::env::var_os("MPICC")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join(".venv").join("bin").join("mpicc"))
}

/// Builds `libftkv_capi.so` into `libs` when it is not there: `cargo test` links the
/// integration tests against the rlib and leaves the cdylib out on a clean tree.
fn build_shared_library(workspace: &Path, libs: &Path) {
    if libs.join("libftkv_capi.so").exists() {
        return;
    }
    let release = libs.file_name().is_some_and(|name| name == "release");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.current_dir(workspace).args(["build", "--quiet", "-p", "ftkv-capi", "--lib"]);
    if release {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "cargo could not build ftkv-capi's shared library");
    assert!(libs.join("libftkv_capi.so").exists(), "no libftkv_capi.so in {}", libs.display());
}

/// Compiles the example against the header and the shared library; the executable's path.
fn build_example() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest.ancestors().nth(2).expect("crates/ftkv-capi in the workspace");
    let libs = profile_dir();
    build_shared_library(workspace, &libs);
    let exe = libs.join("ftkv-checkpoint-example");
    let status = Command::new(mpicc(workspace))
        .arg(workspace.join("examples/c/checkpoint.c"))
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(format!("-L{}", libs.display()))
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .arg("-lftkv_capi")
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("mpicc runs");
    assert!(status.success(), "the C example does not compile");
    exe
}

#[test]
fn the_c_example_reads_a_killed_ranks_last_checkpoint_back() {
    let exe = build_example();
    let out = Launch::new(&exe, 4)
        .args(["1", "10"])
        .timeout(Duration::from_secs(90))
        .transport_from_env()
        .run()
        .expect("mpirun starts");
    eprintln!("TRANSCRIPT\n{}", out.transcript());
    assert!(!out.timed_out, "the C example hung:\n{}", out.transcript());
    let verdict = out.rank_lines(0).iter().find(|l| l.starts_with("failed ranks")).cloned();
    let verdict =
        verdict.unwrap_or_else(|| panic!("rank 0 printed no verdict:\n{}", out.transcript()));
    assert!(verdict.contains("rank 1 iteration 10 -> MATCH"), "{verdict}\n{}", out.transcript());
    assert!(verdict.starts_with("failed ranks: 1;"), "{verdict}\n{}", out.transcript());
    assert!(!out.stderr.contains("checkpoint: "), "a survivor failed:\n{}", out.transcript());
}
