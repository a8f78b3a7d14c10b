/* A C program's own collective after a host's ranks died, under mpirun --with-ft ulfm.
 *
 * Every rank opens a store and writes its checkpoint for SECONDS (argument 1, default 3), or
 * until a put reports a failure, while ranks are SIGKILLed from outside (a whole host's,
 * across simulated hosts).
 * Then each survivor shrinks MPI_COMM_WORLD itself and runs its own MPI_Allreduce of 1 on the
 * shrunk communicator, and prints "allreduce N of M": N must be the survivors' count. With
 * Open MPI's coll/han selected (it is by default on multi-host communicators) this allreduce
 * crashed in mca_coll_han_comm_create; ftkv leaves han out (OMPI_MCA_coll=^han,cuda). */

#include <mpi.h>
#include <mpi-ext.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ftkv.h"

/* After process failures Open MPI's ULFM finalisation sometimes never returns although every
 * survivor called it (as in examples/c/checkpoint.c): the end is bounded. */
enum { END_BOUND_SECONDS = 10 };
static volatile sig_atomic_t end_status = 0;

static void leave_at_end_bound(int sig) {
    (void)sig;
    _exit(end_status);
}

static void fail(const char *what, ftkv_status status) {
    fprintf(stderr, "allreduce_after_failure: %s: %s (%s)\n", what, ftkv_status_message(status),
            ftkv_last_error());
    exit(2);
}

static void check_mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "allreduce_after_failure: %s failed with MPI error %d\n", what, rc);
        exit(4);
    }
}

int main(int argc, char **argv) {
    int provided = 0, rank = 0, size = 0;
    check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "set_errhandler");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    const char *kinds[] = {"checkpoint"};
    ftkv_config config = ftkv_config_default(kinds, 1, 2);
    ftkv_store *store = NULL;
    ftkv_status status = ftkv_store_open(MPI_COMM_WORLD, &config, &store);
    if (status != FTKV_OK) fail("ftkv_store_open", status);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char buf[256];
    double start = MPI_Wtime();
    for (int i = 0; MPI_Wtime() - start < seconds; ++i) {
        int len = snprintf(buf, sizeof buf, "rank %d iteration %d", rank, i);
        status = ftkv_put(store, 0, buf, (size_t)len);
        if (status == FTKV_RECOVERY_NEEDED) break;
        if (status != FTKV_OK) fail("ftkv_put", status);
        usleep(2000);
    }
    MPI_Comm survivors;
    check_mpi(MPIX_Comm_shrink(MPI_COMM_WORLD, &survivors), "MPIX_Comm_shrink");
    int alive = 0, one = 1;
    MPI_Comm_size(survivors, &alive);
    int sum = 0;
    check_mpi(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, survivors), "MPI_Allreduce");
    printf("allreduce %d of %d\n", sum, alive);
    fflush(stdout);
    status = ftkv_store_abandon(store);
    if (status != FTKV_OK) fail("ftkv_store_abandon", status);
    MPI_Comm_free(&survivors);
    printf("done\n");
    fflush(stdout);
    end_status = sum == alive ? 0 : 1;
    signal(SIGALRM, leave_at_end_bound);
    alarm(END_BOUND_SECONDS);
    MPI_Finalize();
    return sum == alive ? 0 : 1;
}
