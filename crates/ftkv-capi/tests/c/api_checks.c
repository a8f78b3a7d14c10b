/* Checks of the C API's documented results, without failures, on 4 or more ranks: every check
 * that does not hold prints "FAILED <what>" and the exit status is 1; "checks passed" at the
 * end otherwise. Rank 1 hands its "loot" key to rank 2 (the outer lock is a message), which
 * writes it with ftkv_put_handed: the reference paper's future-based cooperation. */

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ftkv.h"

static int failures = 0;

#define CHECK(condition)                                                                   \
    do {                                                                                   \
        if (!(condition)) {                                                                \
            printf("FAILED %s (line %d; last error: %s)\n", #condition, __LINE__,          \
                   ftkv_last_error());                                                     \
            ++failures;                                                                    \
        }                                                                                  \
    } while (0)

enum { CHECKPOINT = 0, LOOT = 1, LARGE = 1 << 20 };

static void handles_and_arguments(ftkv_store *store) {
    CHECK(ftkv_put(NULL, CHECKPOINT, "x", 1) == FTKV_INVALID_ARGUMENT);
    CHECK(ftkv_put(store, CHECKPOINT, NULL, 1) == FTKV_INVALID_ARGUMENT);
    CHECK(ftkv_put(store, 7, "x", 1) == FTKV_INVALID_ARGUMENT);
    CHECK(strlen(ftkv_last_error()) > 0);
    CHECK(ftkv_put(store, CHECKPOINT, NULL, 0) == FTKV_OK); /* an empty value */
    CHECK(strlen(ftkv_last_error()) == 0);
    CHECK(ftkv_store_worker(NULL) == -1);
    CHECK(ftkv_needs_recovery(store) == 0);
    CHECK(ftkv_wait(store) == FTKV_OK); /* nothing pending */
    CHECK(ftkv_put_async(store, CHECKPOINT, "small", 5) == FTKV_OK); /* written through */
    CHECK(ftkv_wait(store) == FTKV_OK);
    CHECK(strcmp(ftkv_status_message(FTKV_CONTENDED), "unknown status") != 0);
    CHECK(strcmp(ftkv_status_message(99), "unknown status") == 0);
    int worker;
    CHECK(ftkv_next_failure(store, &worker) == FTKV_NOT_FOUND);
}

/* A 1 MiB asynchronous put, waited for, then read back by the next rank. */
static void asynchronous_put(ftkv_store *store, int rank, int size) {
    static char value[LARGE], got[LARGE];
    memset(value, 'a' + rank, LARGE);
    CHECK(ftkv_put_async(store, CHECKPOINT, value, LARGE) == FTKV_OK);
    CHECK(ftkv_wait(store) == FTKV_OK);
    CHECK(ftkv_sync(store) == FTKV_OK);
    int peer = (rank + 1) % size;
    size_t len = 0;
    CHECK(ftkv_get(store, peer, CHECKPOINT, got, 10, &len) == FTKV_BUFFER_TOO_SMALL);
    CHECK(len == LARGE);
    CHECK(ftkv_get(store, peer, CHECKPOINT, got, LARGE, &len) == FTKV_OK);
    CHECK(len == LARGE && got[0] == 'a' + peer && got[LARGE - 1] == 'a' + peer);
    CHECK(ftkv_get(store, peer, CHECKPOINT, got, LARGE, NULL) == FTKV_INVALID_ARGUMENT);
    /* While a put is pending, only ftkv_wait, queries and collective calls are taken; a
     * barrier completes it from its first copy, unacknowledged. */
    CHECK(ftkv_put_async(store, CHECKPOINT, value, LARGE) == FTKV_OK);
    CHECK(ftkv_get(store, peer, CHECKPOINT, got, LARGE, &len) == FTKV_INVALID_ARGUMENT);
    CHECK(ftkv_put(store, CHECKPOINT, "x", 1) == FTKV_INVALID_ARGUMENT);
    CHECK(ftkv_needs_recovery(store) == 0);
    CHECK(ftkv_sync(store) == FTKV_OK);
    CHECK(ftkv_get(store, peer, CHECKPOINT, got, LARGE, &len) == FTKV_OK && len == LARGE);
}

/* Rank 1 hands its loot key to rank 2, which writes and then deletes it. */
static void handed_writes(ftkv_store *store, int rank) {
    static const char taken[] = "taken over by 2";
    char got[64];
    size_t len = 0;
    if (rank == 1) {
        CHECK(ftkv_put(store, LOOT, "mine", 4) == FTKV_OK);
        /* The key is 2's now. */
        CHECK(MPI_Send(NULL, 0, MPI_BYTE, 2, 0, MPI_COMM_WORLD) == MPI_SUCCESS);
        CHECK(MPI_Recv(NULL, 0, MPI_BYTE, 2, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS);
        CHECK(ftkv_get(store, 1, LOOT, got, sizeof got, &len) == FTKV_NOT_FOUND && len == 0);
    } else if (rank == 2) {
        CHECK(MPI_Recv(NULL, 0, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS);
        CHECK(ftkv_put(store, LOOT, "x", 1) == FTKV_OK); /* its own loot, not 1's */
        CHECK(ftkv_put_handed(store, 1, LOOT, taken, sizeof taken) == FTKV_OK);
        CHECK(ftkv_get(store, 1, LOOT, got, sizeof got, &len) == FTKV_OK);
        CHECK(len == sizeof taken && memcmp(got, taken, len) == 0);
        CHECK(ftkv_delete_handed(store, 1, LOOT) == FTKV_OK);
        CHECK(MPI_Send(NULL, 0, MPI_BYTE, 1, 0, MPI_COMM_WORLD) == MPI_SUCCESS);
    }
}

static void transactions(ftkv_store *store, int rank, int size) {
    int64_t mine = 100 + rank, got = 0;
    ftkv_txn *open = ftkv_txn_new();
    CHECK(ftkv_txn_expect_absent(open, rank, CHECKPOINT) == FTKV_OK);
    CHECK(ftkv_txn_write(open, rank, CHECKPOINT, &mine, sizeof mine) == FTKV_OK);
    ftkv_txn_outcome outcome = FTKV_TXN_ABORTED;
    CHECK(ftkv_transaction(store, open, &outcome) == FTKV_OK && outcome == FTKV_TXN_COMMITTED);
    CHECK(ftkv_transaction(store, open, &outcome) == FTKV_INVALID_ARGUMENT); /* ran once */
    ftkv_txn_free(open);
    CHECK(ftkv_sync(store) == FTKV_OK);

    int peer = (rank + 1) % size;
    ftkv_txn *read = ftkv_txn_new();
    CHECK(ftkv_txn_read(read, peer, CHECKPOINT) == FTKV_OK);
    CHECK(ftkv_transaction(store, read, &outcome) == FTKV_OK && outcome == FTKV_TXN_COMMITTED);
    size_t len = 0;
    uint64_t version = 0;
    CHECK(ftkv_txn_result(read, 0, &got, sizeof got, &len, &version) == FTKV_OK);
    CHECK(len == sizeof got && got == 100 + peer && version >= 1);
    CHECK(ftkv_txn_result(read, 1, &got, sizeof got, &len, NULL) == FTKV_INVALID_ARGUMENT);
    int owner;
    uint16_t kind;
    CHECK(ftkv_txn_aborted_on(read, &owner, &kind) == FTKV_INVALID_ARGUMENT);
    ftkv_txn_free(read);

    /* A condition on a version the key is not at aborts it, and names the key. */
    ftkv_txn *stale = ftkv_txn_new();
    CHECK(ftkv_txn_expect_version(stale, rank, CHECKPOINT, version + 1000) == FTKV_OK);
    CHECK(ftkv_txn_delete(stale, rank, CHECKPOINT) == FTKV_OK);
    CHECK(ftkv_transaction(store, stale, &outcome) == FTKV_OK && outcome == FTKV_TXN_ABORTED);
    CHECK(ftkv_txn_aborted_on(stale, &owner, &kind) == FTKV_OK);
    CHECK(owner == rank && kind == CHECKPOINT);
    ftkv_txn_free(stale);

    /* The transaction records are the store's own kind, after the program's two. */
    CHECK(ftkv_put(store, 2, "x", 1) == FTKV_INVALID_ARGUMENT);

    size_t resolved = 99;
    CHECK(ftkv_resolve_transactions(store, &resolved) == FTKV_OK && resolved == 0);
    CHECK(ftkv_sync(store) == FTKV_OK);
}

int main(int argc, char **argv) {
    int provided, rank, size;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 4;
    CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) == MPI_SUCCESS);
    CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS);
    CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size) == MPI_SUCCESS);

    const char *kinds[] = {"checkpoint", "loot"};
    ftkv_config config = ftkv_config_default(kinds, 2, 2);
    CHECK(config.recovery == FTKV_RECOVERY_GLOBAL && config.reserve_holders == 0);
    config.max_value = 2 * LARGE;
    config.recovery = 5;
    ftkv_store *store = NULL;
    CHECK(ftkv_store_open(MPI_COMM_WORLD, &config, &store) == FTKV_INVALID_ARGUMENT && !store);
    config.recovery = FTKV_RECOVERY_LOCALIZED;
    CHECK(ftkv_store_open(MPI_COMM_WORLD, &config, &store) == FTKV_INVALID_CONFIG && !store);
    config.reserve_holders = 1;
    if (ftkv_store_open(MPI_COMM_WORLD, &config, &store) != FTKV_OK) {
        printf("FAILED ftkv_store_open: %s\n", ftkv_last_error());
        return 1;
    }
    CHECK(ftkv_store_worker(store) == rank);
    handles_and_arguments(store);
    asynchronous_put(store, rank, size);
    handed_writes(store, rank);
    CHECK(ftkv_sync(store) == FTKV_OK);
    ftkv_counters counters;
    CHECK(ftkv_counters_get(store, &counters) == FTKV_OK);
    /* Acknowledged: the empty put, the small and the first large asynchronous put, and the
     * loot writes (the released put is not acknowledged). */
    int own_puts = 3 + (rank == 1) + (rank == 2);
    CHECK(counters.puts == (uint64_t)own_puts + (rank == 2));
    uint64_t handed_bytes = sizeof "taken over by 2";
    CHECK(counters.bytes_written ==
          (uint64_t)LARGE + 5 + (rank == 1 ? 4 : 0) + (rank == 2 ? 1 + handed_bytes : 0));
    CHECK(counters.deletes == (uint64_t)(rank == 2));
    CHECK(counters.failures_noticed == 0 && counters.global_recoveries == 0);
    CHECK(ftkv_store_free(store) == FTKV_OK);

    /* Transactions need their record kind: a store opened with them. */
    config.transactions = 1;
    CHECK(ftkv_store_open(MPI_COMM_WORLD, &config, &store) == FTKV_OK);
    transactions(store, rank, size);
    CHECK(ftkv_counters_get(store, &counters) == FTKV_OK);
    CHECK(counters.transactions_committed == 2 && counters.transactions_aborted == 1);
    CHECK(ftkv_store_free(store) == FTKV_OK);
    CHECK(ftkv_store_free(NULL) == FTKV_OK);

    CHECK(MPI_Finalize() == MPI_SUCCESS);
    if (failures == 0) printf("checks passed\n");
    fflush(stdout);
    return failures == 0 ? 0 : 1;
}
