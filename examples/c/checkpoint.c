/* A C program that checkpoints into ftkv under mpirun --with-ft ulfm.
 *
 * Every rank writes a checkpoint ("rank R iteration I" and a payload) every iteration. Rank
 * VICTIM (argument 1, default 1) kills itself with SIGKILL right after its put of iteration
 * DIE_AT (argument 2, default 10) returned, so that checkpoint is its last acknowledged one.
 * The survivors recover the store, and the first survivor reads the dead rank's checkpoint
 * back and checks that it is exactly that one. Exit status 0 when it is. */

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ftkv.h"

enum { ITERATIONS = 60, PAYLOAD = 4096 };

/* After process failures Open MPI's ULFM finalisation sometimes never returns although every
 * survivor called it (ftkv's own ranks bound it the same way). Once the verdict is out, the
 * end (freeing the store, MPI_Finalize) is bounded: past END_BOUND_SECONDS the process leaves
 * with its verdict as exit status and names the step that did not return. */
enum { END_BOUND_SECONDS = 20 };
static volatile sig_atomic_t end_status = 0;
static volatile sig_atomic_t end_step = 0; /* 0: freeing the store, 1: MPI_Finalize */

static void leave_at_end_bound(int sig) {
    (void)sig;
    static const char freeing[] =
        "ftkv-checkpoint-example: freeing the store has not returned after the end bound\n";
    static const char finalizing[] =
        "ftkv-checkpoint-example: MPI_Finalize has not returned after the end bound\n";
    ssize_t written = end_step == 0 ? write(STDERR_FILENO, freeing, sizeof freeing - 1)
                                    : write(STDERR_FILENO, finalizing, sizeof finalizing - 1);
    (void)written;
    _exit(end_status);
}

static void fail(const char *what, ftkv_status status) {
    fprintf(stderr, "checkpoint: %s: %s (%s)\n", what, ftkv_status_message(status),
            ftkv_last_error());
    exit(2);
}

/* Ends the program when an MPI call before the store existed failed. */
static void check_mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "checkpoint: %s failed with MPI error %d\n", what, rc);
        exit(4);
    }
}

/* The checkpoint of `rank` at `iteration`: a header line, then a payload derived from both. */
static size_t checkpoint(int rank, int iteration, char *buf) {
    int n = snprintf(buf, 64, "rank %d iteration %d\n", rank, iteration);
    for (int i = 0; i < PAYLOAD; ++i) buf[n + i] = (char)('a' + (rank * 7 + iteration + i) % 26);
    return (size_t)n + PAYLOAD;
}

/* Waits (bounded) until the store noticed a failure, then recovers it. */
static void recover_when_noticed(ftkv_store *store) {
    for (int waited = 0; ftkv_needs_recovery(store) == 0; waited += 10) {
        if (waited > 20000) {
            fprintf(stderr, "checkpoint: no failure noticed within 20 s\n");
            exit(3);
        }
        usleep(10000);
    }
    ftkv_status status = ftkv_recover(store);
    if (status != FTKV_OK) fail("ftkv_recover", status);
}

int main(int argc, char **argv) {
    int victim = argc > 1 ? atoi(argv[1]) : 1;
    int die_at = argc > 2 ? atoi(argv[2]) : 10;
    int provided, rank, size;
    check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");

    const char *kinds[] = {"checkpoint"};
    ftkv_store *store = NULL;
    ftkv_status status = ftkv_store_create(MPI_COMM_WORLD, kinds, 1, 2, 0, &store);
    if (status != FTKV_OK) fail("ftkv_store_create", status);

    static char buf[64 + PAYLOAD];
    int recovered = 0;
    for (int iteration = 1; iteration <= ITERATIONS; ++iteration) {
        size_t len = checkpoint(rank, iteration, buf);
        status = ftkv_put(store, 0, buf, len);
        if (status == FTKV_RECOVERY_NEEDED && !recovered) {
            recover_when_noticed(store);
            recovered = 1;
            printf("rank %d recovered at iteration %d\n", rank, iteration);
            status = ftkv_put(store, 0, buf, len);
        }
        if (status != FTKV_OK) fail("ftkv_put", status);
        if (rank == victim && iteration == die_at) raise(SIGKILL);
        usleep(2000);
    }
    if (!recovered) {
        recover_when_noticed(store);
        printf("rank %d recovered after the last iteration\n", rank);
    }

    int failed[8];
    size_t n_failed = 0;
    status = ftkv_failed(store, failed, 8, &n_failed);
    if (status != FTKV_OK) fail("ftkv_failed", status);
    int first_survivor = victim == 0 ? 1 : 0;
    int ok = 1;
    if (rank == first_survivor) {
        static char got[64 + PAYLOAD], want[64 + PAYLOAD];
        size_t got_len = 0, want_len = checkpoint(victim, die_at, want);
        status = ftkv_get(store, victim, 0, got, sizeof got, &got_len);
        if (status != FTKV_OK) fail("ftkv_get", status);
        ok = n_failed == 1 && failed[0] == victim && got_len == want_len &&
             memcmp(got, want, want_len) == 0;
        printf("failed ranks:");
        for (size_t i = 0; i < n_failed && i < 8; ++i) printf(" %d", failed[i]);
        printf("; rank %d's checkpoint: %.*s -> %s\n", victim, (int)strcspn(got, "\n"), got,
               ok ? "MATCH" : "MISMATCH");
        fflush(stdout);
    }
    printf("rank %d done: %zu failed rank(s) seen\n", rank, n_failed);
    fflush(stdout);
    end_status = ok ? 0 : 1;
    signal(SIGALRM, leave_at_end_bound);
    alarm(END_BOUND_SECONDS);
    status = ftkv_store_free(store);
    if (status != FTKV_OK) fail("ftkv_store_free", status);
    end_step = 1;
    /* With a dead member MPI_Finalize may report the failure; the checkpoint was checked. */
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) fprintf(stderr, "checkpoint: MPI_Finalize returned %d\n", rc);
    return ok ? 0 : 1;
}
