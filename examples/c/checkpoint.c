/* A C checkpointing loop on ftkv with localized recovery, under mpirun --with-ft ulfm.
 *
 * Every rank writes its checkpoint ("rank R iteration I" and a payload) every 2 ms for
 * SECONDS (argument 1, default 3), every other one asynchronously, and prints "acked I" once
 * every copy holds it. A rank may be
 * SIGKILLed from outside at any moment: the survivors keep writing while the store moves the
 * copies the dead rank held to reserve holders, they learn of the failure from
 * ftkv_next_failure, and at the end each survivor reads every failed rank's checkpoint and
 * checks that it is whole: "read rank V iteration J -> MATCH". A harness compares J with the
 * dead rank's last "acked" line. Exit status 0 when every read matched. */

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ftkv.h"

enum { PAYLOAD = 4096, MAX_RANKS = 1024 };

/* After process failures Open MPI's ULFM finalisation sometimes never returns although every
 * survivor called it. Once the verdict is out, the end (freeing the store, MPI_Finalize) is
 * bounded: past END_BOUND_SECONDS the process leaves with its verdict as exit status. */
enum { END_BOUND_SECONDS = 20 };
static volatile sig_atomic_t end_status = 0;

static void leave_at_end_bound(int sig) {
    (void)sig;
    static const char said[] = "checkpoint: the end (free, MPI_Finalize) did not return in time\n";
    ssize_t written = write(STDERR_FILENO, said, sizeof said - 1);
    (void)written;
    _exit(end_status);
}

static void fail(const char *what, ftkv_status status) {
    fprintf(stderr, "checkpoint: %s: %s (%s)\n", what, ftkv_status_message(status),
            ftkv_last_error());
    exit(2);
}

static void check_mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "checkpoint: %s failed with MPI error %d\n", what, rc);
        exit(4);
    }
}

static char payload_byte(int rank, int iteration, int i) {
    return (char)('a' + (rank * 7 + iteration + i) % 26);
}

/* The checkpoint of `rank` at `iteration`: a header line, then a payload derived from both. */
static size_t checkpoint(int rank, int iteration, char *buf) {
    int n = snprintf(buf, 64, "rank %d iteration %d\n", rank, iteration);
    for (int i = 0; i < PAYLOAD; ++i) buf[n + i] = payload_byte(rank, iteration, i);
    return (size_t)n + PAYLOAD;
}

/* The iteration of a whole checkpoint of `rank`, or -1 when the bytes are not one. */
static int whole_checkpoint(int rank, const char *buf, size_t len) {
    int owner = -1, iteration = -1, header = 0;
    if (sscanf(buf, "rank %d iteration %d\n%n", &owner, &iteration, &header) != 2) return -1;
    if (owner != rank || (size_t)header + PAYLOAD != len) return -1;
    for (int i = 0; i < PAYLOAD; ++i)
        if (buf[header + i] != payload_byte(rank, iteration, i)) return -1;
    return iteration;
}

/* The store fell back to global recovery: every survivor recovers. */
static void recover(ftkv_store *store) {
    printf("global recovery\n");
    ftkv_status status = ftkv_recover(store);
    if (status != FTKV_OK) fail("ftkv_recover", status);
}

/* An asynchronous put, completed at once: the program would compute in between. */
static ftkv_status put_and_wait(ftkv_store *store, const char *buf, size_t len) {
    ftkv_status status = ftkv_put_async(store, 0, buf, len);
    return status == FTKV_OK ? ftkv_wait(store) : status;
}

/* Prints each failure the store noticed since the last look, once. */
static void report_failures(ftkv_store *store) {
    int worker;
    while (ftkv_next_failure(store, &worker) == FTKV_OK) {
        printf("noticed failure of worker %d\n", worker);
    }
}

/* Reads every failed rank's checkpoint and prints the verdict; 1 when all are whole. */
static int read_failed_checkpoints(ftkv_store *store) {
    static int failed[MAX_RANKS];
    static char got[64 + PAYLOAD];
    size_t n_failed = 0;
    ftkv_status status = ftkv_failed(store, failed, MAX_RANKS, &n_failed);
    if (status != FTKV_OK) fail("ftkv_failed", status);
    int ok = 1;
    for (size_t f = 0; f < n_failed && f < MAX_RANKS; ++f) {
        size_t len = 0;
        while ((status = ftkv_get(store, failed[f], 0, got, sizeof got, &len)) ==
               FTKV_RECOVERY_NEEDED)
            recover(store);
        if (status == FTKV_NOT_FOUND) {
            printf("read rank %d -> NOT FOUND\n", failed[f]);
            ok = 0;
            continue;
        }
        if (status != FTKV_OK) fail("ftkv_get", status);
        int iteration = whole_checkpoint(failed[f], got, len);
        printf("read rank %d iteration %d -> %s\n", failed[f], iteration,
               iteration > 0 ? "MATCH" : "MISMATCH");
        ok = ok && iteration > 0;
    }
    return ok;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    int provided, rank;
    check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");

    const char *kinds[] = {"checkpoint"};
    ftkv_config config = ftkv_config_default(kinds, 1, 2);
    config.recovery = FTKV_RECOVERY_LOCALIZED;
    config.reserve_holders = 1;
    ftkv_store *store = NULL;
    ftkv_status status = ftkv_store_open(MPI_COMM_WORLD, &config, &store);
    if (status != FTKV_OK) fail("ftkv_store_open", status);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);

    static char buf[64 + PAYLOAD];
    double start = MPI_Wtime();
    int iteration = 1;
    for (; MPI_Wtime() - start < seconds; ++iteration) {
        size_t len = checkpoint(rank, iteration, buf);
        /* Every other checkpoint asynchronously: buf stays unchanged until ftkv_wait returned. */
        while ((status = iteration % 2 ? ftkv_put(store, 0, buf, len)
                                        : put_and_wait(store, buf, len)) == FTKV_RECOVERY_NEEDED)
            recover(store);
        if (status != FTKV_OK) fail("ftkv_put", status);
        printf("acked %d\n", iteration);
        fflush(stdout);
        report_failures(store);
        usleep(2000);
    }
    printf("wrote %d checkpoints\n", iteration - 1);

    while ((status = ftkv_follow(store)) == FTKV_RECOVERY_NEEDED) recover(store);
    if (status != FTKV_OK) fail("ftkv_follow", status);
    /* The barrier at the end: after a failure it asks for one global recovery. A rank stopped
     * (not dead) since before the end is declared failed only here, once the bound passed. */
    while ((status = ftkv_sync(store)) == FTKV_RECOVERY_NEEDED) recover(store);
    if (status != FTKV_OK) fail("ftkv_sync", status);
    report_failures(store);
    int ok = read_failed_checkpoints(store);
    ftkv_counters counters;
    status = ftkv_counters_get(store, &counters);
    if (status != FTKV_OK) fail("ftkv_counters_get", status);
    printf("counters puts=%llu repairs=%llu keys_moved=%llu global_recoveries=%llu\n",
           (unsigned long long)counters.puts, (unsigned long long)counters.repairs,
           (unsigned long long)counters.keys_moved,
           (unsigned long long)counters.global_recoveries);
    printf("done\n");
    fflush(stdout);

    end_status = ok ? 0 : 1;
    signal(SIGALRM, leave_at_end_bound);
    alarm(END_BOUND_SECONDS);
    status = ftkv_store_free(store);
    if (status != FTKV_OK) fail("ftkv_store_free", status);
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) fprintf(stderr, "checkpoint: MPI_Finalize returned %d\n", rc);
    return ok ? 0 : 1;
}
