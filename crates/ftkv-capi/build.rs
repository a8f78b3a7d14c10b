//! Generates `include/ftkv.h` from the crate's source with cbindgen, and gives the shared
//! library an rpath to Open MPI's libraries (as `ftkv-mpi` does for binaries).

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml is readable");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    bindings.write_to_file(crate_dir.join("include").join("ftkv.h"));
    if let Some(dirs) = std::env::var_os("DEP_MPI_LIBDIRS") {
        for dir in dirs.to_string_lossy().split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
