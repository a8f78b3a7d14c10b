//! `scripts/install.sh` into a fresh prefix under the target directory (twice: it is
//! repeatable), then what a user of the installed C and C++ API does with it: compile and link
//! with plain `cc` and `c++` and the flags of `pkg-config --cflags --libs ftkv`, build every
//! example of `examples/` with CMake through `find_package(ftkv)`, link the C example
//! statically against `libftkv.a` (through `pkg-config --static ... ftkv-static` and through
//! CMake's `ftkv::ftkv_static`) and check that it needs no `libftkv.so`, and run the programs
//! under `mpirun`. Every tool runs under a hard timeout; a missing `cmake`, `pkg-config`, `cc`,
//! `c++` or `ldd` fails the tests with a pointer to `scripts/setup.sh`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ftkv_launch::launch::{kill_process_group, Launch};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn workspace() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().nth(2).expect("crates/ftkv-capi in the workspace")
}

/// This run's directory under the target directory: the prefix, the builds, the programs.
fn scratch() -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    let profile = test.ancestors().nth(2).and_then(Path::file_name).expect("target/<profile>");
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ftkv-install-{}", profile.to_string_lossy()))
}

fn bound(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

/// Runs `cmd` in a process group of its own with its output captured; past `bound` the whole
/// group is SIGKILLed and the test fails.
fn run_within(mut cmd: Command, what: &str, bound: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = kill_process_group(child.id());
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = Output {
        status: status.unwrap_or_default(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    assert!(status.is_some(), "{what} did not end within {bound:?}\n{}", said(&output));
    output
}

fn said(output: &Output) -> String {
    format!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `cmd` within `bound` and fails the test unless it succeeded; its stdout.
fn succeed(cmd: Command, what: &str, bound: Duration) -> String {
    let output = run_within(cmd, what, bound);
    assert!(output.status.success(), "{what} failed ({})\n{}", output.status, said(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Fails the test, naming `scripts/setup.sh`, when `tool` cannot be run.
fn require(tool: &str) {
    let mut cmd = Command::new(tool);
    cmd.arg("--version").stdout(Stdio::null()).stderr(Stdio::null());
    if let Err(e) = cmd.status() {
        panic!("{tool} cannot be run ({e}): run scripts/setup.sh, which installs it");
    }
}

/// The prefix `scripts/install.sh` installed into, once for all tests of this file: a fresh
/// directory, installed into twice.
fn installed() -> &'static Path {
    static PREFIX: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let prefix = PREFIX.get_or_init(|| {
        let scratch = scratch();
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        }
        let prefix = scratch.join("prefix");
        for round in ["first", "second"] {
            let mut install = Command::new("bash");
            install.current_dir(workspace()).arg("scripts/install.sh").arg(&prefix);
            let what = format!("scripts/install.sh {} ({round} run)", prefix.display());
            let output = run_within(install, &what, bound(1800));
            if !output.status.success() {
                return Err(format!("{what} failed ({})\n{}", output.status, said(&output)));
            }
        }
        Ok(prefix)
    });
    match prefix {
        Ok(prefix) => prefix,
        Err(why) => panic!("{why}"),
    }
}

/// `pkg-config ARGS ftkv` with the installed prefix's `lib/pkgconfig` on the search path.
fn pkg_config(prefix: &Path, args: &[&str]) -> String {
    pkg_config_of(prefix, "ftkv", args)
}

/// `pkg-config ARGS MODULE` with the installed prefix's `lib/pkgconfig` on the search path.
fn pkg_config_of(prefix: &Path, module: &str, args: &[&str]) -> String {
    require("pkg-config");
    let mut cmd = Command::new("pkg-config");
    cmd.env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")).args(args).arg(module);
    let what = format!("pkg-config {} {module}", args.join(" "));
    succeed(cmd, &what, bound(30)).trim().to_owned()
}

/// The files directly in `dir` whose name ends with `suffix`, sorted.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.is_file() && path.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    files
}

/// Asserts that every library `exe` needs is found, `libftkv.so` in the installed prefix.
fn assert_loads_from(exe: &Path, prefix: &Path) {
    let mut ldd = Command::new("ldd");
    ldd.arg(exe);
    let libs = succeed(ldd, &format!("ldd {}", exe.display()), bound(30));
    assert!(!libs.contains("not found"), "{} misses libraries:\n{libs}", exe.display());
    let ftkv = libs.lines().find(|l| l.trim_start().starts_with("libftkv.so "));
    let ftkv = ftkv.unwrap_or_else(|| panic!("{} needs no libftkv.so:\n{libs}", exe.display()));
    let from = format!("=> {}", prefix.join("lib/libftkv.so").display());
    assert!(ftkv.contains(&from), "{} loads another libftkv.so:\n{libs}", exe.display());
    assert!(libs.contains("libmpi.so"), "{} needs no libmpi:\n{libs}", exe.display());
}

/// Asserts that `exe`, linked against `libftkv.a`, needs no `libftkv.so` (neither itself nor
/// through another library) and that every library it needs, Open MPI's among them, is found.
fn assert_needs_no_libftkv_so(exe: &Path) {
    require("ldd");
    let mut ldd = Command::new("ldd");
    ldd.arg(exe);
    let libs = succeed(ldd, &format!("ldd {}", exe.display()), bound(30));
    assert!(!libs.contains("not found"), "{} misses libraries:\n{libs}", exe.display());
    let ftkv = libs.lines().find(|l| l.trim_start().starts_with("libftkv"));
    assert!(ftkv.is_none(), "{} needs a shared libftkv:\n{libs}", exe.display());
    assert!(libs.contains("libmpi.so"), "{} needs no libmpi:\n{libs}", exe.display());
}

/// Runs the C checkpoint example `exe` on 4 ranks for half a second without failures: every
/// rank starts (its libraries load), writes, reads and prints `done`, and the job succeeds.
fn assert_checkpoint_runs(exe: &Path) {
    let ranks = 4;
    let job = Launch::new(exe, ranks).args(["0.5"]).timeout(bound(120));
    let job = job.transport_from_env().run().expect("mpirun starts");
    let name = exe.display();
    assert!(!job.timed_out, "{name} hung:\n{}", job.transcript());
    assert!(!job.stderr.contains("error while loading shared libraries"), "{}", job.transcript());
    for rank in 0..ranks {
        let done = job.rank_lines(rank).iter().any(|l| l == "done");
        assert!(done, "rank {rank} of {name} did not print done:\n{}", job.transcript());
    }
    assert_eq!(job.status.map(|s| s.success()), Some(true), "{}", job.transcript());
}

#[test]
fn the_install_puts_each_file_in_place_and_records_the_version() {
    require("pkg-config");
    let prefix = installed();
    let include_src = workspace().join("crates/ftkv-capi/include");
    let mut headers = files_ending(&include_src, ".h");
    headers.extend(files_ending(&include_src, ".hpp"));
    assert!(
        headers.iter().any(|h| h.ends_with("ftkv.h")),
        "no ftkv.h in {}",
        include_src.display()
    );
    for header in &headers {
        let name = header.file_name().expect("a file name");
        let copy = std::fs::read(prefix.join("include").join(name));
        let copy = copy
            .unwrap_or_else(|e| panic!("include/{} not installed: {e}", name.to_string_lossy()));
        assert_eq!(copy, std::fs::read(header).expect("the header"), "{}", header.display());
    }
    for lib in ["lib/libftkv.so", "lib/libftkv.a"] {
        let bytes = std::fs::read(prefix.join(lib)).unwrap_or_else(|e| panic!("{lib}: {e}"));
        let magic: &[u8] = if lib.ends_with(".so") { b"\x7fELF" } else { b"!<arch>\n" };
        assert!(bytes.starts_with(magic), "{lib} is not a library");
    }
    let license = std::fs::read_to_string(prefix.join("share/doc/ftkv/LICENSE")).expect("LICENSE");
    assert_eq!(license, std::fs::read_to_string(workspace().join("LICENSE")).expect("LICENSE"));
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    assert!(license.contains("END OF TERMS AND CONDITIONS"), "the LICENSE is cut short");
    assert!(license.contains("APPENDIX: How to apply the Apache License to your work."));

    let pc = std::fs::read_to_string(prefix.join("lib/pkgconfig/ftkv.pc")).expect("ftkv.pc");
    assert!(pc.contains(&format!("\nprefix={}\n", prefix.display())), "{pc}");
    assert_eq!(pkg_config(prefix, &["--modversion"]), VERSION);
    let cmake = prefix.join("lib/cmake/ftkv");
    assert!(cmake.join("ftkvConfig.cmake").is_file(), "no ftkvConfig.cmake in {}", cmake.display());
    let version = std::fs::read_to_string(cmake.join("ftkvConfigVersion.cmake")).expect("version");
    assert!(version.contains(&format!("set(PACKAGE_VERSION \"{VERSION}\")")), "{version}");

    // The flags name the prefix and an MPI whose mpi.h is where they say.
    let cflags = pkg_config(prefix, &["--cflags"]);
    assert!(cflags.contains(&format!("-I{}/include", prefix.display())), "{cflags}");
    let mpi_h = cflags.split_whitespace().filter_map(|f| f.strip_prefix("-I"));
    assert!(mpi_h.map(Path::new).any(|dir| dir.join("mpi.h").is_file()), "no mpi.h: {cflags}");
    let libs = pkg_config(prefix, &["--libs"]);
    for lib in ["-lftkv", "-lmpi"] {
        assert!(libs.split_whitespace().any(|f| f == lib), "no {lib} in {libs}");
    }

    // ftkv-static names the archive by its path, never -lftkv, and carries the system
    // libraries that ftkv.pc lists as private (rustc's native-static-libs).
    assert_eq!(pkg_config_of(prefix, "ftkv-static", &["--modversion"]), VERSION);
    let static_libs = pkg_config_of(prefix, "ftkv-static", &["--static", "--libs"]);
    let static_flags: Vec<&str> = static_libs.split_whitespace().collect();
    let archive = prefix.join("lib/libftkv.a").display().to_string();
    assert!(static_flags.contains(&archive.as_str()), "no {archive} in {static_libs}");
    assert!(!static_flags.contains(&"-lftkv"), "-lftkv in {static_libs}");
    assert!(static_flags.contains(&"-lmpi"), "no -lmpi in {static_libs}");
    let private = pc.lines().find_map(|l| l.strip_prefix("Libs.private:"));
    let private: Vec<&str> = private.unwrap_or_default().split_whitespace().collect();
    assert!(private.iter().any(|f| f.starts_with("-l")), "no Libs.private in ftkv.pc:\n{pc}");
    for flag in &private {
        assert!(static_flags.contains(flag), "{flag} of ftkv.pc not in {static_libs}");
    }
    let config = std::fs::read_to_string(cmake.join("ftkvConfig.cmake")).expect("config");
    let static_target = config.split("add_library(ftkv::ftkv_static").nth(1);
    let static_target = static_target.expect("ftkv::ftkv_static in ftkvConfig.cmake");
    for flag in &private {
        assert!(static_target.contains(flag), "{flag} not in ftkv::ftkv_static:\n{config}");
    }
}

#[test]
fn programs_built_with_pkg_config_flags_load_and_run() {
    for tool in ["pkg-config", "cc", "c++"] {
        require(tool);
    }
    let prefix = installed();
    let flags = pkg_config(prefix, &["--cflags", "--libs"]);
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let out = scratch().join("pkg-config");
    std::fs::create_dir_all(&out).expect("the output directory");

    // The C example, with plain cc.
    let checkpoint = out.join("checkpoint");
    let mut cc = Command::new("cc");
    cc.arg("-Wall").arg(workspace().join("examples/c/checkpoint.c")).args(&flags);
    cc.arg("-o").arg(&checkpoint);
    succeed(cc, "cc examples/c/checkpoint.c $(pkg-config --cflags --libs ftkv)", bound(120));
    assert!(checkpoint.is_file(), "cc built no {}", checkpoint.display());
    assert_loads_from(&checkpoint, prefix);

    // A C++17 program with plain c++: the C++ header when installed, else the C one.
    let header = if prefix.join("include/ftkv.hpp").exists() { "ftkv.hpp" } else { "ftkv.h" };
    let source = out.join("probe.cpp");
    std::fs::write(&source, probe_source(header)).expect("the probe's source");
    let probe = out.join("probe");
    let mut cxx = Command::new("c++");
    cxx.args(["-std=c++17", "-Wall"]).arg(&source).args(&flags).arg("-o").arg(&probe);
    succeed(
        cxx,
        &format!("c++ (#include <{header}>) $(pkg-config --cflags --libs ftkv)"),
        bound(300),
    );
    assert_loads_from(&probe, prefix);

    let job = Launch::new(&probe, 2).timeout(bound(60)).transport_from_env().run();
    let job = job.expect("mpirun starts");
    assert!(!job.timed_out, "the C++ program hung:\n{}", job.transcript());
    for rank in 0..2 {
        // After the prefix: libftkv's words for FTKV_OK.
        let said = format!("ftkv probe: rank {rank} of 2: ");
        let line = job.rank_lines(rank).iter().find_map(|l| l.strip_prefix(&said));
        let message = line.unwrap_or_else(|| panic!("no {said:?} line:\n{}", job.transcript()));
        assert!(!message.is_empty() && message != "(null)", "{message:?}\n{}", job.transcript());
    }
    assert_eq!(job.status.map(|s| s.success()), Some(true), "{}", job.transcript());

    // The C example briefly: it starts, loads both libraries and prints from main.
    let job = Launch::new(&checkpoint, 4).args(["1"]).timeout(bound(90));
    let job = job.transport_from_env().run().expect("mpirun starts");
    assert!(!job.timed_out, "the C example hung:\n{}", job.transcript());
    assert!(!job.stderr.contains("error while loading shared libraries"), "{}", job.transcript());
    let printed = (0..4).any(|rank| !job.rank_lines(rank).is_empty());
    assert!(printed, "no rank of the C example printed a line:\n{}", job.transcript());
}

#[test]
fn cmake_builds_every_example_with_find_package() {
    require("cmake");
    let prefix = installed();
    let examples = workspace().join("examples");
    let build = scratch().join("examples-build");
    let mut configure = Command::new("cmake");
    configure.arg("-S").arg(&examples).arg("-B").arg(&build);
    configure.arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()));
    succeed(configure, "cmake (configuring examples/)", bound(180));
    let cache = std::fs::read_to_string(build.join("CMakeCache.txt")).expect("CMakeCache.txt");
    let found = format!("ftkv_DIR:PATH={}", prefix.join("lib/cmake/ftkv").display());
    assert!(cache.lines().any(|l| l == found), "find_package(ftkv) did not find {found}");
    let mut make = Command::new("cmake");
    make.arg("--build").arg(&build);
    succeed(make, "cmake --build (examples/)", bound(900));

    let stem =
        |path: PathBuf| path.file_stem().expect("a file name").to_string_lossy().into_owned();
    let c = files_ending(&examples.join("c"), ".c").into_iter().map(stem);
    let cpp = files_ending(&examples.join("cpp"), ".cpp").into_iter().map(stem);
    let mut expected: Vec<String> = c.map(|s| format!("ftkv-example-{s}")).collect();
    expected.extend(cpp.map(|s| format!("ftkv-example-{s}-cpp")));
    assert!(expected.iter().any(|e| e == "ftkv-example-checkpoint"), "{expected:?}");
    for name in &expected {
        let exe = build.join(name);
        assert!(exe.is_file(), "cmake built no {name} in {}", build.display());
        assert_loads_from(&exe, prefix);
    }
}

#[test]
fn the_c_example_linked_with_ftkv_static_pc_needs_no_libftkv_so_and_runs() {
    require("cc");
    let prefix = installed();
    let flags = pkg_config_of(prefix, "ftkv-static", &["--static", "--cflags", "--libs"]);
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let out = scratch().join("pkg-config-static");
    std::fs::create_dir_all(&out).expect("the output directory");
    let checkpoint = out.join("checkpoint");
    let mut cc = Command::new("cc");
    cc.arg("-Wall").arg(workspace().join("examples/c/checkpoint.c")).args(&flags);
    cc.arg("-o").arg(&checkpoint);
    let what = "cc examples/c/checkpoint.c $(pkg-config --static --cflags --libs ftkv-static)";
    succeed(cc, what, bound(300));
    assert!(checkpoint.is_file(), "cc built no {}", checkpoint.display());
    assert_needs_no_libftkv_so(&checkpoint);
    assert_checkpoint_runs(&checkpoint);
}

#[test]
fn cmake_links_the_c_example_with_ftkv_static_and_it_needs_no_libftkv_so_and_runs() {
    require("cmake");
    let prefix = installed();
    let build = scratch().join("examples-build-static");
    let mut configure = Command::new("cmake");
    configure.arg("-S").arg(workspace().join("examples")).arg("-B").arg(&build);
    configure.arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()));
    configure.arg("-DFTKV_EXAMPLES_STATIC=ON");
    let what = "cmake -DFTKV_EXAMPLES_STATIC=ON (configuring examples/)";
    let said = succeed(configure, what, bound(180));
    assert!(said.contains("linked with ftkv::ftkv_static"), "{said}");
    let mut make = Command::new("cmake");
    make.arg("--build").arg(&build).args(["--target", "ftkv-example-checkpoint"]);
    succeed(make, "cmake --build --target ftkv-example-checkpoint (static)", bound(600));
    let checkpoint = build.join("ftkv-example-checkpoint");
    assert!(checkpoint.is_file(), "cmake built no {}", checkpoint.display());
    assert_needs_no_libftkv_so(&checkpoint);
    assert_checkpoint_runs(&checkpoint);
}

/// A C++ program that initialises MPI, calls into libftkv and prints one line per rank.
fn probe_source(header: &str) -> String {
    format!(
        r#"#include <{header}>

#include <cstdio>

int main(int argc, char **argv) {{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *message = ftkv_status_message(FTKV_OK);
    std::printf("ftkv probe: rank %d of %d: %s\n", rank, size, message ? message : "(null)");
    std::fflush(stdout);
    MPI_Finalize();
    return message ? 0 : 1;
}}
"#
    )
}
