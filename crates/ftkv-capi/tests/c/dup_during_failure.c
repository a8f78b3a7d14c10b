/* Open MPI's MPI_Comm_dup when a member dies during it, without ftkv: every rank duplicates
 * MPI_COMM_WORLD and frees the copy in a loop, for at most 60 s, until one fails; a rank is
 * SIGKILLed from outside meanwhile, most likely inside a duplication. Each survivor prints
 * "dup round=R class=C" once a duplication fails (C: the MPI error class) and leaves.
 *
 * Open MPI 5.0.10 and 5.0.11 crash here (SIGSEGV, NULL + 0x450): the failure's handler,
 * ompi_errhandler_proc_failed_internal, marks the rank failed in every communicator that holds
 * it (ompi_comm_set_rank_failed), including the duplicate still being activated
 * (ompi_comm_activate), and ompi_comm_revoke_local calls comm->c_coll->coll_revoke_local
 * on it before its collectives are selected (c_coll is NULL). 5.0.9 has no coll_revoke_local
 * call. A duplicate, a shrink, a split or a window (which duplicates its communicator) that a
 * failure meets while it is being made can crash every survivor that is making it. */

#include <mpi.h>
#include <mpi-ext.h>
#include <stdio.h>
#include <unistd.h>

static void check(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "dup_during_failure: %s failed with MPI error %d\n", what, rc);
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
}

int main(int argc, char **argv) {
    int provided, rank;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    double end = MPI_Wtime() + 60;
    for (int round = 0; MPI_Wtime() < end; round++) {
        MPI_Comm copy;
        int rc = MPI_Comm_dup(MPI_COMM_WORLD, &copy);
        if (rc != MPI_SUCCESS) {
            int error_class;
            check(MPI_Error_class(rc, &error_class), "MPI_Error_class");
            printf("dup round=%d class=%d proc_failed=%d\n", round, error_class,
                   MPIX_ERR_PROC_FAILED);
            fflush(stdout);
            sleep(1);
            _exit(0);
        }
        check(MPI_Comm_free(&copy), "MPI_Comm_free");
    }
    printf("no failure met\n");
    fflush(stdout);
    _exit(0);
}
