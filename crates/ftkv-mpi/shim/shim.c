/* Exports Open MPI's handle macros and mpi-ext.h constants as plain symbols, so the Rust
 * declarations in src/ffi.rs need no knowledge of Open MPI's internal structures. */
#include <stddef.h>
#include <mpi.h>
#include <mpi-ext.h>

MPI_Comm const ftkv_comm_world = MPI_COMM_WORLD;
MPI_Comm const ftkv_comm_null = MPI_COMM_NULL;
MPI_Group const ftkv_group_null = MPI_GROUP_NULL;
MPI_Win const ftkv_win_null = MPI_WIN_NULL;
MPI_Info const ftkv_info_null = MPI_INFO_NULL;
MPI_Request const ftkv_request_null = MPI_REQUEST_NULL;
MPI_Errhandler const ftkv_errors_return = MPI_ERRORS_RETURN;
MPI_Datatype const ftkv_type_byte = MPI_BYTE;
MPI_Datatype const ftkv_type_uint64 = MPI_UINT64_T;
MPI_Op const ftkv_op_replace = MPI_REPLACE;
MPI_Op const ftkv_op_no_op = MPI_NO_OP;
MPI_Op const ftkv_op_sum = MPI_SUM;

int const ftkv_success = MPI_SUCCESS;
int const ftkv_err_proc_failed = MPIX_ERR_PROC_FAILED;
int const ftkv_err_proc_failed_pending = MPIX_ERR_PROC_FAILED_PENDING;
int const ftkv_err_revoked = MPIX_ERR_REVOKED;
int const ftkv_any_source = MPI_ANY_SOURCE;
int const ftkv_any_tag = MPI_ANY_TAG;
int const ftkv_undefined = MPI_UNDEFINED;
int const ftkv_thread_multiple = MPI_THREAD_MULTIPLE;
int const ftkv_lock_exclusive = MPI_LOCK_EXCLUSIVE;
int const ftkv_lock_shared = MPI_LOCK_SHARED;
int const ftkv_max_error_string = MPI_MAX_ERROR_STRING;

size_t const ftkv_status_size = sizeof(MPI_Status);
size_t const ftkv_status_source_offset = offsetof(MPI_Status, MPI_SOURCE);
size_t const ftkv_status_tag_offset = offsetof(MPI_Status, MPI_TAG);
size_t const ftkv_status_error_offset = offsetof(MPI_Status, MPI_ERROR);
size_t const ftkv_aint_size = sizeof(MPI_Aint);
