//! Hand-written declarations of the Open MPI 5 C API used by ftkv, and of the constants that
//! `shim/shim.c` exports. Handles are opaque pointers in Open MPI's ABI.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_double, c_int, c_void};

pub type MPI_Comm = *mut c_void;
pub type MPI_Group = *mut c_void;
pub type MPI_Win = *mut c_void;
pub type MPI_Info = *mut c_void;
pub type MPI_Request = *mut c_void;
pub type MPI_Errhandler = *mut c_void;
pub type MPI_Datatype = *mut c_void;
pub type MPI_Op = *mut c_void;
pub type MPI_Aint = isize;

/// Open MPI's `struct ompi_status_public_t`; the layout is checked against the shim at start-up.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MPI_Status {
    pub source: c_int,
    pub tag: c_int,
    pub error: c_int,
    pub cancelled: c_int,
    pub ucount: usize,
}

extern "C" {
    pub static ftkv_comm_world: MPI_Comm;
    pub static ftkv_comm_null: MPI_Comm;
    pub static ftkv_group_null: MPI_Group;
    pub static ftkv_win_null: MPI_Win;
    pub static ftkv_info_null: MPI_Info;
    pub static ftkv_request_null: MPI_Request;
    pub static ftkv_errors_return: MPI_Errhandler;
    pub static ftkv_type_byte: MPI_Datatype;
    pub static ftkv_type_uint64: MPI_Datatype;
    pub static ftkv_op_replace: MPI_Op;
    pub static ftkv_op_no_op: MPI_Op;
    pub static ftkv_op_sum: MPI_Op;

    pub static ftkv_success: c_int;
    pub static ftkv_err_proc_failed: c_int;
    pub static ftkv_err_proc_failed_pending: c_int;
    pub static ftkv_err_revoked: c_int;
    /// Read by the test that checks `comm::ANY_SOURCE`.
    #[allow(dead_code)]
    pub static ftkv_any_source: c_int;
    /// Read by the test that checks `comm::ANY_TAG`.
    #[allow(dead_code)]
    pub static ftkv_any_tag: c_int;
    pub static ftkv_undefined: c_int;
    pub static ftkv_thread_multiple: c_int;
    pub static ftkv_lock_exclusive: c_int;
    pub static ftkv_lock_shared: c_int;
    pub static ftkv_max_error_string: c_int;

    pub static ftkv_status_size: usize;
    pub static ftkv_status_source_offset: usize;
    pub static ftkv_status_tag_offset: usize;
    pub static ftkv_status_error_offset: usize;
    pub static ftkv_aint_size: usize;
}

extern "C" {
    pub fn MPI_Init_thread(
        argc: *mut c_int,
        argv: *mut *mut *mut c_char,
        required: c_int,
        provided: *mut c_int,
    ) -> c_int;
    pub fn MPI_Finalize() -> c_int;
    pub fn MPI_Initialized(flag: *mut c_int) -> c_int;
    pub fn MPI_Query_thread(provided: *mut c_int) -> c_int;
    pub fn MPI_Wtime() -> c_double;
    pub fn MPI_Get_processor_name(name: *mut c_char, len: *mut c_int) -> c_int;
    pub fn MPI_Error_class(code: c_int, class: *mut c_int) -> c_int;
    pub fn MPI_Error_string(code: c_int, string: *mut c_char, len: *mut c_int) -> c_int;
    pub fn MPI_Get_address(location: *const c_void, address: *mut MPI_Aint) -> c_int;

    pub fn MPI_Comm_set_errhandler(comm: MPI_Comm, handler: MPI_Errhandler) -> c_int;
    pub fn MPI_Comm_rank(comm: MPI_Comm, rank: *mut c_int) -> c_int;
    pub fn MPI_Comm_size(comm: MPI_Comm, size: *mut c_int) -> c_int;
    pub fn MPI_Comm_dup(comm: MPI_Comm, newcomm: *mut MPI_Comm) -> c_int;
    pub fn MPI_Comm_split(
        comm: MPI_Comm,
        color: c_int,
        key: c_int,
        newcomm: *mut MPI_Comm,
    ) -> c_int;
    pub fn MPI_Comm_free(comm: *mut MPI_Comm) -> c_int;
    pub fn MPI_Comm_group(comm: MPI_Comm, group: *mut MPI_Group) -> c_int;
    pub fn MPI_Group_size(group: MPI_Group, size: *mut c_int) -> c_int;
    pub fn MPI_Group_translate_ranks(
        group1: MPI_Group,
        n: c_int,
        ranks1: *const c_int,
        group2: MPI_Group,
        ranks2: *mut c_int,
    ) -> c_int;
    pub fn MPI_Group_free(group: *mut MPI_Group) -> c_int;

    pub fn MPI_Barrier(comm: MPI_Comm) -> c_int;
    pub fn MPI_Allgather(
        sendbuf: *const c_void,
        sendcount: c_int,
        sendtype: MPI_Datatype,
        recvbuf: *mut c_void,
        recvcount: c_int,
        recvtype: MPI_Datatype,
        comm: MPI_Comm,
    ) -> c_int;
    pub fn MPI_Send(
        buf: *const c_void,
        count: c_int,
        datatype: MPI_Datatype,
        dest: c_int,
        tag: c_int,
        comm: MPI_Comm,
    ) -> c_int;
    pub fn MPI_Ssend(
        buf: *const c_void,
        count: c_int,
        datatype: MPI_Datatype,
        dest: c_int,
        tag: c_int,
        comm: MPI_Comm,
    ) -> c_int;
    pub fn MPI_Issend(
        buf: *const c_void,
        count: c_int,
        datatype: MPI_Datatype,
        dest: c_int,
        tag: c_int,
        comm: MPI_Comm,
        request: *mut MPI_Request,
    ) -> c_int;
    pub fn MPI_Recv(
        buf: *mut c_void,
        count: c_int,
        datatype: MPI_Datatype,
        source: c_int,
        tag: c_int,
        comm: MPI_Comm,
        status: *mut MPI_Status,
    ) -> c_int;
    pub fn MPI_Isend(
        buf: *const c_void,
        count: c_int,
        datatype: MPI_Datatype,
        dest: c_int,
        tag: c_int,
        comm: MPI_Comm,
        request: *mut MPI_Request,
    ) -> c_int;
    pub fn MPI_Irecv(
        buf: *mut c_void,
        count: c_int,
        datatype: MPI_Datatype,
        source: c_int,
        tag: c_int,
        comm: MPI_Comm,
        request: *mut MPI_Request,
    ) -> c_int;
    pub fn MPI_Iprobe(
        source: c_int,
        tag: c_int,
        comm: MPI_Comm,
        flag: *mut c_int,
        status: *mut MPI_Status,
    ) -> c_int;
    pub fn MPI_Test(request: *mut MPI_Request, flag: *mut c_int, status: *mut MPI_Status) -> c_int;
    pub fn MPI_Cancel(request: *mut MPI_Request) -> c_int;
    pub fn MPI_Request_free(request: *mut MPI_Request) -> c_int;
    pub fn MPI_Get_count(
        status: *const MPI_Status,
        datatype: MPI_Datatype,
        count: *mut c_int,
    ) -> c_int;

    pub fn MPIX_Comm_revoke(comm: MPI_Comm) -> c_int;
    pub fn MPIX_Comm_is_revoked(comm: MPI_Comm, flag: *mut c_int) -> c_int;
    pub fn MPIX_Comm_shrink(comm: MPI_Comm, newcomm: *mut MPI_Comm) -> c_int;
    pub fn MPIX_Comm_get_failed(comm: MPI_Comm, failed: *mut MPI_Group) -> c_int;
    pub fn MPIX_Comm_ack_failed(comm: MPI_Comm, num_to_ack: c_int, num_acked: *mut c_int) -> c_int;
    pub fn MPIX_Comm_agree(comm: MPI_Comm, flag: *mut c_int) -> c_int;
    pub fn MPIX_Comm_iagree(comm: MPI_Comm, flag: *mut c_int, request: *mut MPI_Request) -> c_int;

    pub fn MPI_Win_allocate(
        size: MPI_Aint,
        disp_unit: c_int,
        info: MPI_Info,
        comm: MPI_Comm,
        baseptr: *mut c_void,
        win: *mut MPI_Win,
    ) -> c_int;
    pub fn MPI_Win_allocate_shared(
        size: MPI_Aint,
        disp_unit: c_int,
        info: MPI_Info,
        comm: MPI_Comm,
        baseptr: *mut c_void,
        win: *mut MPI_Win,
    ) -> c_int;
    pub fn MPI_Win_create_dynamic(info: MPI_Info, comm: MPI_Comm, win: *mut MPI_Win) -> c_int;
    pub fn MPI_Win_attach(win: MPI_Win, base: *mut c_void, size: MPI_Aint) -> c_int;
    pub fn MPI_Win_detach(win: MPI_Win, base: *const c_void) -> c_int;
    pub fn MPI_Win_set_errhandler(win: MPI_Win, handler: MPI_Errhandler) -> c_int;
    pub fn MPI_Win_free(win: *mut MPI_Win) -> c_int;
    pub fn MPI_Win_lock(lock_type: c_int, rank: c_int, assert: c_int, win: MPI_Win) -> c_int;
    pub fn MPI_Win_unlock(rank: c_int, win: MPI_Win) -> c_int;
    pub fn MPI_Win_lock_all(assert: c_int, win: MPI_Win) -> c_int;
    pub fn MPI_Win_unlock_all(win: MPI_Win) -> c_int;
    pub fn MPI_Win_flush(rank: c_int, win: MPI_Win) -> c_int;
    pub fn MPI_Win_flush_all(win: MPI_Win) -> c_int;
    pub fn MPI_Win_sync(win: MPI_Win) -> c_int;
    pub fn MPI_Win_shared_query(
        win: MPI_Win,
        rank: c_int,
        size: *mut MPI_Aint,
        disp_unit: *mut c_int,
        baseptr: *mut c_void,
    ) -> c_int;
    pub fn MPI_Win_fence(assert: c_int, win: MPI_Win) -> c_int;
    pub fn MPI_Put(
        origin: *const c_void,
        origin_count: c_int,
        origin_type: MPI_Datatype,
        target: c_int,
        target_disp: MPI_Aint,
        target_count: c_int,
        target_type: MPI_Datatype,
        win: MPI_Win,
    ) -> c_int;
    pub fn MPI_Get(
        origin: *mut c_void,
        origin_count: c_int,
        origin_type: MPI_Datatype,
        target: c_int,
        target_disp: MPI_Aint,
        target_count: c_int,
        target_type: MPI_Datatype,
        win: MPI_Win,
    ) -> c_int;
    pub fn MPI_Accumulate(
        origin: *const c_void,
        origin_count: c_int,
        origin_type: MPI_Datatype,
        target: c_int,
        target_disp: MPI_Aint,
        target_count: c_int,
        target_type: MPI_Datatype,
        op: MPI_Op,
        win: MPI_Win,
    ) -> c_int;
    pub fn MPI_Compare_and_swap(
        origin: *const c_void,
        compare: *const c_void,
        result: *mut c_void,
        datatype: MPI_Datatype,
        target: c_int,
        target_disp: MPI_Aint,
        win: MPI_Win,
    ) -> c_int;
    pub fn MPI_Fetch_and_op(
        origin: *const c_void,
        result: *mut c_void,
        datatype: MPI_Datatype,
        target: c_int,
        target_disp: MPI_Aint,
        op: MPI_Op,
        win: MPI_Win,
    ) -> c_int;
}
