#!/usr/bin/env bash
# Installs ftkv's C and C++ API into PREFIX (default /usr/local), after building it with
# `cargo build --release -p ftkv-capi`:
#
#   PREFIX/lib/libftkv.so, PREFIX/lib/libftkv.a        the shared and the static library
#   PREFIX/include/ftkv.h (and every other *.h, *.hpp of crates/ftkv-capi/include)
#   PREFIX/lib/pkgconfig/ftkv.pc                        for `pkg-config --cflags --libs ftkv`
#   PREFIX/lib/pkgconfig/ftkv-static.pc                 for `pkg-config --static --cflags --libs
#                                                       ftkv-static`: libftkv.a, no libftkv.so
#   PREFIX/lib/cmake/ftkv/ftkvConfig.cmake, ftkvConfigVersion.cmake
#                                                       for `find_package(ftkv)`: ftkv::ftkv,
#                                                       ftkv::ftkv_static
#   PREFIX/share/doc/ftkv/LICENSE
#
# ftkv.h includes <mpi.h> and the library is linked against the Open MPI that `mpicc` belongs to
# (MPICC when set, else FTKV_VENV/bin/mpicc, default <workspace>/.venv, as the build uses). Open
# MPI's PyPI build ships no pkg-config file, so ftkv.pc, ftkv-static.pc and ftkvConfig.cmake
# record that Open MPI's include and library directories (asked of its mpicc here) and, as mpicc
# does, an rpath to them and to PREFIX/lib: programs built with them start without
# LD_LIBRARY_PATH. A static link of libftkv.a also needs the system libraries the Rust standard
# library and ftkv's dependencies use; rustc names them (--print native-static-libs) and the
# three files record its list.
#
# Running it again replaces the files. DESTDIR, when set, is put before every path written
# (staged installs); the files still refer to PREFIX. When PREFIX cannot be written by this user,
# the build runs as this user and only the copies run under sudo.
set -euo pipefail

usage() { echo "usage: $0 [PREFIX]   (default /usr/local)" >&2; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  -*) usage; exit 2 ;;
esac
[ $# -le 1 ] || { usage; exit 2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=$(realpath -m -s -- "${1:-/usr/local}")
dest="${DESTDIR:-}$prefix"
mpicc="${MPICC:-${FTKV_VENV:-$root/.venv}/bin/mpicc}"
include_src="$root/crates/ftkv-capi/include"

log() { printf '[install] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ -x "$mpicc" ] || die "no mpicc at $mpicc: run scripts/setup.sh (or set MPICC to Open MPI 5's mpicc)"

command -v python3 >/dev/null || die "no python3 (needed to read cargo metadata's JSON)"

# Files written into a private directory first, then installed like the others.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

cargo=${CARGO:-cargo} # the cargo running this script, if any
log "building the C API: cargo build --release -p ftkv-capi"
(cd "$root" && "$cargo" build --release -p ftkv-capi)

# The system libraries a static link of libftkv.a needs, as rustc names them when it links the
# staticlib. `cargo rustc --crate-type staticlib` is a build unit of its own (the crate's
# staticlib alone), so it does not make the build above stale; when it is up to date cargo
# replays rustc's cached messages, this note included, so the list is there on every run.
# Whichever of the two units was compiled last has its archive in target/release: both are
# built from the same sources and are up to date once both commands have run.
log "asking rustc for libftkv.a's system libraries (--print native-static-libs)"
(cd "$root" && "$cargo" rustc --color never --release -p ftkv-capi --lib --crate-type staticlib \
  -- --print native-static-libs) 2>&1 | tee "$stage/rustc.log" >&2
native_static_libs=$(sed -n 's/^note: native-static-libs: *//p' "$stage/rustc.log" | tail -n 1)
if [ -z "$native_static_libs" ]; then
  # What rustc names on Linux (glibc) for ftkv's staticlib; -lmpi comes with MPI's flags anyway.
  native_static_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
  log "warning: rustc printed no native-static-libs; using $native_static_libs"
fi
read -r -a static_libs <<<"$native_static_libs"

target_dir=$(cd "$root" && "$cargo" metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])') ||
  die "cargo metadata failed or gave no target directory"
[ -n "$target_dir" ] || die "cargo metadata names no target directory"
pkgid=$(cd "$root" && "$cargo" pkgid -p ftkv-capi)
version=${pkgid##*[#@]}
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "no version in cargo's package id '$pkgid'"
built="$target_dir/release"
for file in "$built/libftkv_capi.so" "$built/libftkv_capi.a" "$include_src/ftkv.h"; do
  [ -f "$file" ] || die "the build left no $file"
done

# The Open MPI the library was linked against: directories, libraries and other flags.
showme() { "$mpicc" "--showme:$1"; }
read -r -a mpi_incdirs <<<"$(showme incdirs)"
read -r -a mpi_libdirs <<<"$(showme libdirs)"
read -r -a mpi_libs <<<"$(showme libs)"
read -r -a mpi_compile <<<"$(showme compile)"
read -r -a mpi_link <<<"$(showme link)"
[ ${#mpi_incdirs[@]} -gt 0 ] && [ ${#mpi_libs[@]} -gt 0 ] ||
  die "$mpicc --showme gives no include directory or library"
mpi_cflags_other=() # -pthread: what mpicc compiles with besides include directories
for flag in "${mpi_compile[@]}"; do [[ "$flag" == -I* ]] || mpi_cflags_other+=("$flag"); done
mpi_threads=""
for flag in "${mpi_link[@]}"; do [ "$flag" != "-pthread" ] || mpi_threads="-pthread"; done
mpirun="$(dirname "$mpicc")/mpirun"

pc_mpi_cflags="" pc_mpi_libs=""
for dir in "${mpi_incdirs[@]}"; do pc_mpi_cflags+=" -I$dir"; done
for flag in "${mpi_cflags_other[@]}"; do pc_mpi_cflags+=" $flag"; done
for dir in "${mpi_libdirs[@]}"; do pc_mpi_libs+=" -L$dir -Wl,-rpath,$dir"; done
for lib in "${mpi_libs[@]}"; do pc_mpi_libs+=" -l$lib"; done
[ -z "$mpi_threads" ] || pc_mpi_libs+=" $mpi_threads"
pc_static=""
for flag in "${static_libs[@]}"; do pc_static+=" $flag"; done
cat >"$stage/ftkv.pc" <<EOF
# ftkv's C and C++ API. Its headers include <mpi.h> and the library is linked against the Open
# MPI whose flags are recorded below (from $mpicc); programs also get an rpath to
# ftkv's and that Open MPI's libraries, as mpicc gives. Run them with mpirun_path.
# Libs links the shared library libftkv.so. Libs.private lists the system libraries libftkv.a
# needs (rustc's native-static-libs), but --static cannot make -lftkv pick libftkv.a: the
# linker takes libftkv.so, which sits next to it. Static linking is the module ftkv-static:
#   pkg-config --static --cflags --libs ftkv-static
prefix=$prefix
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include
mpirun_path=$mpirun

Name: ftkv
Description: A resilient in-memory key-value store on MPI with ULFM (the C and C++ API)
Version: $version
Cflags: -I\${includedir}$pc_mpi_cflags
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lftkv$pc_mpi_libs
Libs.private:$pc_static
EOF

cat >"$stage/ftkv-static.pc" <<EOF
# ftkv's C and C++ API linked statically: the archive libftkv.a by its path, so that no linker
# picks libftkv.so instead (ftkv.pc's -lftkv does), then the Open MPI ftkv is linked against
# (a shared library, with an rpath to it, as mpicc gives) and the system libraries libftkv.a
# needs (rustc's native-static-libs). The archive is only ever linked statically, so Libs is
# the whole link line: \`pkg-config --libs ftkv-static\` and --static give the same.
# Programs need no libftkv.so at run time. Run them with mpirun_path.
prefix=$prefix
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include
mpirun_path=$mpirun

Name: ftkv-static
Description: A resilient in-memory key-value store on MPI with ULFM (the C and C++ API, static)
Version: $version
Cflags: -I\${includedir}$pc_mpi_cflags
Libs: \${libdir}/libftkv.a$pc_mpi_libs$pc_static
EOF

# CMake lists: the elements joined with ';', each quoted as a whole in the file.
join() { local IFS=';'; echo "$*"; }
cm_link_options=()
[ -z "$mpi_threads" ] || cm_link_options+=("$mpi_threads")
for dir in "${mpi_libdirs[@]}"; do cm_link_options+=("-Wl,-rpath,$dir"); done
pointer_bytes=$(($(getconf LONG_BIT) / 8))
cat >"$stage/ftkvConfig.cmake" <<EOF
# ftkv's CMake package (ftkv $version). After find_package(ftkv):
#   ftkv::ftkv         the shared library libftkv.so and the headers (ftkv.h, ftkv.hpp)
#   ftkv::ftkv_static  the static library libftkv.a and the headers, with the system
#                      libraries it needs (rustc's native-static-libs); no libftkv.so
#   ftkv::mpi          the Open MPI ftkv is linked against (both targets bring it)
#   ftkv_MPIEXEC       that Open MPI's mpirun, to run the programs with
# ftkv's headers include <mpi.h>: ftkv::mpi carries the include and library directories,
# libraries and flags of that Open MPI, recorded from $mpicc,
# and an rpath to its libraries, as mpicc gives. ftkv's prefix is found from this file's
# location (PREFIX/lib/cmake/ftkv), so this package still works when ftkv's installed tree is
# moved as a whole. Only ftkv's prefix is relocatable: the Open MPI paths below (directories,
# rpaths, ftkv_MPIEXEC) are absolute and libftkv is linked against that Open MPI, which must
# stay where it was.
if(CMAKE_VERSION VERSION_LESS 3.13)
  set(ftkv_FOUND FALSE)
  set(ftkv_NOT_FOUND_MESSAGE "ftkv's CMake package needs CMake 3.13 or newer")
  return()
endif()
get_filename_component(_ftkv_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
foreach(_ftkv_file IN ITEMS include/ftkv.h lib/libftkv.so lib/libftkv.a)
  if(NOT EXISTS "\${_ftkv_prefix}/\${_ftkv_file}")
    set(ftkv_FOUND FALSE)
    set(ftkv_NOT_FOUND_MESSAGE "ftkv's installation in \${_ftkv_prefix} has no \${_ftkv_file}")
    unset(_ftkv_prefix)
    return()
  endif()
endforeach()

set(ftkv_VERSION "$version")
set(ftkv_INCLUDE_DIRS "\${_ftkv_prefix}/include")
set(ftkv_MPIEXEC "$mpirun")

if(NOT TARGET ftkv::mpi)
  add_library(ftkv::mpi INTERFACE IMPORTED)
  set_target_properties(ftkv::mpi PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "$(join "${mpi_incdirs[@]}")"
    INTERFACE_COMPILE_OPTIONS "$(join "${mpi_cflags_other[@]}")"
    INTERFACE_LINK_DIRECTORIES "$(join "${mpi_libdirs[@]}")"
    INTERFACE_LINK_LIBRARIES "$(join "${mpi_libs[@]}")"
    INTERFACE_LINK_OPTIONS "$(join "${cm_link_options[@]}")")
endif()

if(NOT TARGET ftkv::ftkv)
  add_library(ftkv::ftkv SHARED IMPORTED)
  # The library has no soname: linked as -L<dir> -lftkv, not by its path.
  set_target_properties(ftkv::ftkv PROPERTIES
    IMPORTED_LOCATION "\${_ftkv_prefix}/lib/libftkv.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "\${_ftkv_prefix}/include"
    INTERFACE_LINK_LIBRARIES ftkv::mpi
    INTERFACE_LINK_OPTIONS "-Wl,-rpath,\${_ftkv_prefix}/lib")
endif()

if(NOT TARGET ftkv::ftkv_static)
  add_library(ftkv::ftkv_static STATIC IMPORTED)
  set_target_properties(ftkv::ftkv_static PROPERTIES
    IMPORTED_LOCATION "\${_ftkv_prefix}/lib/libftkv.a"
    INTERFACE_INCLUDE_DIRECTORIES "\${_ftkv_prefix}/include"
    INTERFACE_LINK_LIBRARIES "ftkv::mpi;$(join "${static_libs[@]}")")
endif()

unset(_ftkv_prefix)
unset(_ftkv_file)
EOF

cat >"$stage/ftkvConfigVersion.cmake" <<EOF
# The version of ftkv's CMake package: $version. A request is met by this version when it is
# not newer and, semver-wise, API-compatible: the same major version, or for 0.x the same minor
# one. Ranges (find_package(ftkv 0.1...0.3)) are met when they hold this version. Only a build
# with $pointer_bytes-byte pointers can use it.
set(PACKAGE_VERSION "$version")
string(REGEX MATCH "^([0-9]+)\\\\.([0-9]+)" _ftkv_mm "\${PACKAGE_VERSION}")
set(_ftkv_major "\${CMAKE_MATCH_1}")
set(_ftkv_minor "\${CMAKE_MATCH_2}")
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(PACKAGE_FIND_VERSION_RANGE)
  if(PACKAGE_FIND_VERSION_MIN VERSION_LESS_EQUAL PACKAGE_VERSION AND
     ((PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "INCLUDE" AND
       PACKAGE_VERSION VERSION_LESS_EQUAL PACKAGE_FIND_VERSION_MAX) OR
      (PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "EXCLUDE" AND
       PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION_MAX)))
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
elseif(NOT PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  if(_ftkv_major STREQUAL "0")
    if(PACKAGE_FIND_VERSION_MAJOR STREQUAL "0" AND PACKAGE_FIND_VERSION_MINOR STREQUAL _ftkv_minor)
      set(PACKAGE_VERSION_COMPATIBLE TRUE)
    endif()
  elseif(PACKAGE_FIND_VERSION_MAJOR STREQUAL _ftkv_major)
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
if(CMAKE_SIZEOF_VOID_P AND NOT CMAKE_SIZEOF_VOID_P STREQUAL "$pointer_bytes")
  set(PACKAGE_VERSION "\${PACKAGE_VERSION} ($((pointer_bytes * 8))bit)")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
unset(_ftkv_mm)
unset(_ftkv_major)
unset(_ftkv_minor)
EOF

# The copies: under sudo only when this user cannot write the destination.
nearest=$dest
while [ ! -e "$nearest" ]; do nearest=$(dirname "$nearest"); done
as_root=""
[ -w "$nearest" ] || [ "$(id -u)" -eq 0 ] || as_root="sudo"
put() { $as_root install "$@"; }

log "installing ftkv $version into ${DESTDIR:+$DESTDIR }$prefix"
put -d "$dest/lib/pkgconfig" "$dest/lib/cmake/ftkv" "$dest/include" "$dest/share/doc/ftkv"
put -m 0755 "$built/libftkv_capi.so" "$dest/lib/libftkv.so"
put -m 0644 "$built/libftkv_capi.a" "$dest/lib/libftkv.a"
shopt -s nullglob
headers=("$include_src"/*.h "$include_src"/*.hpp)
shopt -u nullglob
put -m 0644 "${headers[@]}" "$dest/include/"
put -m 0644 "$stage/ftkv.pc" "$stage/ftkv-static.pc" "$dest/lib/pkgconfig/"
put -m 0644 "$stage/ftkvConfig.cmake" "$stage/ftkvConfigVersion.cmake" "$dest/lib/cmake/ftkv/"
put -m 0644 "$root/LICENSE" "$dest/share/doc/ftkv/LICENSE"

log "installed: lib/libftkv.so, lib/libftkv.a, $(printf 'include/%s ' "${headers[@]##*/}")"
log "  lib/pkgconfig/ftkv.pc, lib/pkgconfig/ftkv-static.pc, lib/cmake/ftkv/, share/doc/ftkv/LICENSE"
log "pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs ftkv"
log "  static:   PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --static --cflags --libs ftkv-static"
log "CMake:      find_package(ftkv REQUIRED) with -DCMAKE_PREFIX_PATH=$prefix; link ftkv::ftkv"
log "  static:   link ftkv::ftkv_static"
log "run with:   $mpirun --with-ft ulfm -n <ranks> ./program"
