/* Open MPI's MPI_Barrier after a member's death, without ftkv: the error class each survivor
 * gets, and whether ULFM knows the failure when the barrier returns.
 *
 * Every rank prints "ready pid=P" and enters a first barrier; then rank 2 sleeps (it is
 * SIGKILLed from outside meanwhile) and the others enter a second barrier, which the death
 * interrupts. Each survivor prints "barrier class=C known_failed=K": C is the MPI error class
 * the barrier returned, K the size of MPIX_Comm_get_failed's group right after it.
 *
 * Under MPI_THREAD_MULTIPLE, Open MPI 5.0 returns MPI_ERR_OTHER (not MPI_ERR_PROC_FAILED) to
 * the root of its linear barrier, the one it picks for small communicators: its internal
 * ompi_request_default_wait_all keeps the OPAL_ERROR of the failure's wake-up across its
 * re-check, and the root's any-source receive ends with MPI_ERR_PROC_FAILED_PENDING, which
 * does not replace it. ULFM does know the failure by then (K is 1), which is what ftkv's
 * Comm::barrier relies on to report it as the failure it is. */

#include <mpi.h>
#include <mpi-ext.h>
#include <stdio.h>
#include <unistd.h>

static void check(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "barrier_after_failure: %s failed with MPI error %d\n", what, rc);
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
    check(MPI_Barrier(MPI_COMM_WORLD), "the first MPI_Barrier");
    if (rank == 2) {
        sleep(60);
        return 0;
    }
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    int error_class = MPI_SUCCESS;
    if (rc != MPI_SUCCESS) check(MPI_Error_class(rc, &error_class), "MPI_Error_class");
    MPI_Group failed;
    int known_failed = 0;
    check(MPIX_Comm_get_failed(MPI_COMM_WORLD, &failed), "MPIX_Comm_get_failed");
    check(MPI_Group_size(failed, &known_failed), "MPI_Group_size");
    check(MPI_Group_free(&failed), "MPI_Group_free");
    printf("barrier class=%d known_failed=%d other=%d proc_failed=%d\n", error_class,
           known_failed, MPI_ERR_OTHER, MPIX_ERR_PROC_FAILED);
    fflush(stdout);
    /* The survivors leave without MPI_Finalize (after a failure it may not return), once the
     * others had the time to look at their failed group. */
    sleep(1);
    _exit(0);
}
