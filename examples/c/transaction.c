/* Transactions from C on ftkv, under mpirun --with-ft ulfm, with a coordinator killed.
 *
 * Every rank owns an account holding 100 units. For SECONDS (argument 1, default 3) every
 * rank transfers one unit at a time from its account to another rank's, each transfer a
 * transaction coordinated by the sending rank: a first transaction reads both balances and
 * their versions, a second one writes both on the condition that neither changed (the
 * sender's by version, the receiver's by value). A rank may be SIGKILLed from outside at any
 * moment, in the middle of a transaction it coordinates: the first live holder of its
 * transaction record finishes it (all of its writes or none). At the end the first survivor
 * reads every account, the dead ranks' too, in one transaction and prints "total T of N
 * accounts -> MATCH" when no unit was created or lost. Exit status 0 then. */

#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ftkv.h"

enum { START_BALANCE = 100, END_BOUND_SECONDS = 20 };
static volatile sig_atomic_t end_status = 0;

static void leave_at_end_bound(int sig) {
    (void)sig;
    static const char said[] = "transaction: the end (free, MPI_Finalize) did not return in time\n";
    ssize_t written = write(STDERR_FILENO, said, sizeof said - 1);
    (void)written;
    _exit(end_status);
}

static void fail(const char *what, ftkv_status status) {
    fprintf(stderr, "transaction: %s: %s (%s)\n", what, ftkv_status_message(status),
            ftkv_last_error());
    exit(2);
}

static void check(ftkv_status status, const char *what) {
    if (status != FTKV_OK) fail(what, status);
}

static void check_mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "transaction: %s failed with MPI error %d\n", what, rc);
        exit(4);
    }
}

/* The store fell back to global recovery: recover, then finish the transactions it left half
 * done (this worker's own among them). */
static void recover(ftkv_store *store) {
    check(ftkv_recover(store), "ftkv_recover");
    ftkv_txn_decision decision;
    check(ftkv_finish_transactions(store, &decision), "ftkv_finish_transactions");
    printf("global recovery (own interrupted transaction: %s)\n",
           decision == FTKV_TXN_NONE ? "none"
           : decision == FTKV_TXN_DECIDED_COMMIT ? "committed" : "aborted");
}

/* Runs `txn`, recovering when the store asks for it; FTKV_OK or FTKV_CONTENDED, with
 * `*outcome` set on FTKV_OK. After a recovery the transaction is not run again: its record
 * decided it (see recover). */
static ftkv_status run(ftkv_store *store, ftkv_txn *txn, ftkv_txn_outcome *outcome) {
    ftkv_status status = ftkv_transaction(store, txn, outcome);
    if (status == FTKV_RECOVERY_NEEDED) {
        recover(store);
        *outcome = FTKV_TXN_ABORTED;
        return FTKV_OK;
    }
    if (status != FTKV_OK && status != FTKV_CONTENDED) fail("ftkv_transaction", status);
    return status;
}

/* The `i`-th read of a committed transaction as a balance, with its version. */
static int64_t balance(const ftkv_txn *txn, size_t i, uint64_t *version) {
    int64_t value = 0;
    size_t len = 0;
    check(ftkv_txn_result(txn, i, &value, sizeof value, &len, version), "ftkv_txn_result");
    if (len != sizeof value) fail("an account of the wrong size", FTKV_INVALID_ARGUMENT);
    return value;
}

/* One transfer of a unit from `from` to `to`; 1 when it committed. */
static int transfer(ftkv_store *store, int from, int to) {
    ftkv_txn *read = ftkv_txn_new();
    check(ftkv_txn_read(read, from, 0), "ftkv_txn_read");
    check(ftkv_txn_read(read, to, 0), "ftkv_txn_read");
    ftkv_txn_outcome outcome;
    if (run(store, read, &outcome) != FTKV_OK || outcome != FTKV_TXN_COMMITTED) {
        ftkv_txn_free(read);
        return 0;
    }
    uint64_t from_version, to_version;
    int64_t from_balance = balance(read, 0, &from_version);
    int64_t to_balance = balance(read, 1, &to_version);
    ftkv_txn_free(read);

    int64_t from_after = from_balance - 1, to_after = to_balance + 1;
    ftkv_txn *move = ftkv_txn_new();
    check(ftkv_txn_expect_version(move, from, 0, from_version), "ftkv_txn_expect_version");
    check(ftkv_txn_expect_value(move, to, 0, &to_balance, sizeof to_balance),
          "ftkv_txn_expect_value");
    check(ftkv_txn_write(move, from, 0, &from_after, sizeof from_after), "ftkv_txn_write");
    check(ftkv_txn_write(move, to, 0, &to_after, sizeof to_after), "ftkv_txn_write");
    int committed = run(store, move, &outcome) == FTKV_OK && outcome == FTKV_TXN_COMMITTED;
    ftkv_txn_free(move);
    return committed;
}

/* Every account's balance read in one transaction; their sum. */
static int64_t total(ftkv_store *store, int size) {
    for (;;) {
        ftkv_txn *all = ftkv_txn_new();
        for (int owner = 0; owner < size; ++owner) check(ftkv_txn_read(all, owner, 0), "read");
        ftkv_txn_outcome outcome;
        if (run(store, all, &outcome) == FTKV_OK && outcome == FTKV_TXN_COMMITTED) {
            int64_t sum = 0;
            for (int owner = 0; owner < size; ++owner) sum += balance(all, (size_t)owner, NULL);
            ftkv_txn_free(all);
            return sum;
        }
        ftkv_txn_free(all);
    }
}

/* Prints each failure noticed since the last look, once, and resolves the transactions of
 * failed coordinators whose backup this rank is. */
static void handle_failures(ftkv_store *store) {
    int worker, noticed = 0;
    while (ftkv_next_failure(store, &worker) == FTKV_OK) {
        printf("noticed failure of worker %d\n", worker);
        noticed = 1;
    }
    if (!noticed) return;
    size_t resolved = 0;
    ftkv_status status;
    while ((status = ftkv_resolve_transactions(store, &resolved)) == FTKV_RECOVERY_NEEDED)
        recover(store);
    check(status, "ftkv_resolve_transactions");
    if (resolved > 0) printf("resolved %zu transaction(s) of failed coordinators\n", resolved);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    int provided, rank, size;
    check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");

    const char *kinds[] = {"account"};
    ftkv_config config = ftkv_config_default(kinds, 1, 2);
    config.recovery = FTKV_RECOVERY_LOCALIZED;
    config.reserve_holders = 1;
    config.transactions = 1;
    ftkv_store *store = NULL;
    check(ftkv_store_open(MPI_COMM_WORLD, &config, &store), "ftkv_store_open");

    /* Keys that transactions write are written by transactions only: the opening balance too. */
    int64_t opening = START_BALANCE;
    ftkv_txn *open = ftkv_txn_new();
    check(ftkv_txn_expect_absent(open, rank, 0), "ftkv_txn_expect_absent");
    check(ftkv_txn_write(open, rank, 0, &opening, sizeof opening), "ftkv_txn_write");
    ftkv_txn_outcome outcome;
    check(ftkv_transaction(store, open, &outcome), "the opening transaction");
    ftkv_txn_free(open);
    if (outcome != FTKV_TXN_COMMITTED) fail("the opening transaction aborted", FTKV_OK);
    check(ftkv_sync(store), "ftkv_sync");
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);

    int committed = 0, tried = 0;
    double start = MPI_Wtime();
    for (int i = 1; MPI_Wtime() - start < seconds; ++i) {
        int to = (rank + 1 + i % (size - 1)) % size;
        committed += transfer(store, rank, to);
        ++tried;
        handle_failures(store);
    }
    printf("transfers committed %d of %d\n", committed, tried);

    ftkv_status status;
    while ((status = ftkv_follow(store)) == FTKV_RECOVERY_NEEDED) recover(store);
    check(status, "ftkv_follow");
    handle_failures(store);
    /* Every survivor is past its transfers before the total is read. */
    while ((status = ftkv_sync(store)) == FTKV_RECOVERY_NEEDED) recover(store);
    check(status, "ftkv_sync");

    int ok = 1;
    int failed[1024];
    size_t n_failed = 0;
    check(ftkv_failed(store, failed, 1024, &n_failed), "ftkv_failed");
    int first_survivor = 0;
    for (size_t f = 0; f < n_failed && f < 1024; ++f)
        if (failed[f] == first_survivor) ++first_survivor;
    if (rank == first_survivor) {
        int64_t sum = total(store, size);
        ok = sum == (int64_t)START_BALANCE * size;
        printf("total %lld of %d accounts -> %s\n", (long long)sum, size,
               ok ? "MATCH" : "MISMATCH");
    }
    /* Nobody frees the store while the first survivor may still need a recovery. */
    while ((status = ftkv_sync(store)) == FTKV_RECOVERY_NEEDED) recover(store);
    check(status, "ftkv_sync");
    ftkv_counters counters;
    check(ftkv_counters_get(store, &counters), "ftkv_counters_get");
    printf("counters committed=%llu aborted=%llu resolved=%llu\n",
           (unsigned long long)counters.transactions_committed,
           (unsigned long long)counters.transactions_aborted,
           (unsigned long long)counters.transactions_resolved);
    printf("done\n");
    fflush(stdout);

    end_status = ok ? 0 : 1;
    signal(SIGALRM, leave_at_end_bound);
    alarm(END_BOUND_SECONDS);
    check(ftkv_store_free(store), "ftkv_store_free");
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) fprintf(stderr, "transaction: MPI_Finalize returned %d\n", rc);
    return ok ? 0 : 1;
}
