//! Gives this crate's binaries, tests and examples an rpath to Open MPI's libraries (found by
//! `ftkv-mpi`'s build script), so they run without `LD_LIBRARY_PATH`.
fn main() {
    let dirs = std::env::var("DEP_MPI_LIBDIRS").expect("ftkv-mpi is a direct dependency");
    for dir in dirs.split(':').filter(|d| !d.is_empty()) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
