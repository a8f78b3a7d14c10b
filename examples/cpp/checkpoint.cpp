/* A C++ program that checkpoints into ftkv, with localized recovery, under
 * mpirun --with-ft ulfm (C++17, ftkv.hpp).
 *
 * Usage: checkpoint [SECONDS]   (default 3)
 *
 * Every rank opens a store on MPI_COMM_WORLD (kind "checkpoint", 2 copies, localized recovery
 * with 1 reserve holder), prints `ready pid=<pid>`, and then for SECONDS writes a checkpoint
 * per iteration I: "rank R iteration I\n" and 4096 payload bytes derived from (R, I), written
 * with put_async and completed with wait; `acked I` once it is on every copy. A rank may be
 * killed from outside (SIGKILL) at any time: the survivors print `noticed failure of worker
 * V` when the store reports it and keep writing while the store moves the failed worker's
 * copies to reserve holders. Should the store fall back to global recovery (RecoveryNeeded),
 * a survivor prints `global recovery`, recovers, and writes the same iteration again.
 *
 * At the end every survivor follows the store up to every failure, reads each failed
 * worker's last checkpoint and checks that it is whole (its payload is the one of the
 * iteration its first line names): `read rank V iteration J -> MATCH` (or MISMATCH, or
 * `read rank V -> NOT FOUND`), then meets the others (sync, recovering globally and syncing
 * again while it reports RecoveryNeeded), prints `done`, frees the store and finalises MPI. Exit status 0 when every read matched, 1 otherwise, 2 when an ftkv call
 * failed, 4 when MPI could not start. */

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ftkv.hpp"

/* After process failures Open MPI's ULFM finalisation sometimes never returns although every
 * survivor called it. Once the verdict is out, the end (freeing the store, MPI_Finalize) is
 * bounded: past END_BOUND_SECONDS the process leaves with its verdict as exit status and names
 * the step that did not return. */
static const unsigned END_BOUND_SECONDS = 20;
static volatile sig_atomic_t end_status = 0;
static volatile sig_atomic_t end_step = 0; /* 0: freeing the store, 1: MPI_Finalize */

extern "C" void leave_at_end_bound(int) {
    static const char freeing[] =
        "ftkv-cpp-checkpoint-example: freeing the store has not returned after the end bound\n";
    static const char finalizing[] =
        "ftkv-cpp-checkpoint-example: MPI_Finalize has not returned after the end bound\n";
    ssize_t written = end_step == 0 ? write(STDERR_FILENO, freeing, sizeof freeing - 1)
                                    : write(STDERR_FILENO, finalizing, sizeof finalizing - 1);
    (void)written;
    _exit(end_status);
}

namespace {

const std::uint16_t CHECKPOINT = 0; /* the index of kind "checkpoint" */
const int PAYLOAD = 4096;

/* Prints on stdout and flushes (whoever reads the output sees each line as it comes). */
__attribute__((format(printf, 1, 2))) void say(const char *format, ...) {
    std::va_list args;
    va_start(args, format);
    std::vprintf(format, args);
    va_end(args);
    std::fflush(stdout);
}

/* Ends the program after a failed ftkv call: the store is left without a collective call
 * (the other ranks are elsewhere), and the process ends without running exit handlers, which
 * could meet ftkv's threads still running. */
[[noreturn]] void fail(ftkv::Store *store, const ftkv::Error &e) {
    std::fprintf(stderr, "checkpoint: %s\n", e.what());
    std::fflush(stdout);
    if (store != nullptr) store->abandon();
    std::_Exit(2);
}

/* Ends the program when an MPI call before the store existed failed. */
void check_mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        std::fprintf(stderr, "checkpoint: %s failed with MPI error %d\n", what, rc);
        std::exit(4);
    }
}

/* The checkpoint of `rank` at `iteration`: a header line, then a payload derived from both. */
std::string checkpoint(int rank, long iteration) {
    std::string value =
        "rank " + std::to_string(rank) + " iteration " + std::to_string(iteration) + "\n";
    value.reserve(value.size() + PAYLOAD);
    for (long i = 0; i < PAYLOAD; ++i) {
        value.push_back(static_cast<char>('a' + (rank * 7L + iteration + i) % 26));
    }
    return value;
}

/* The store fell back to global recovery: recover it with the other survivors. */
void global_recovery(ftkv::Store &store) {
    say("global recovery\n");
    store.recover();
}

/* Prints every failed worker the store reports for the first time. */
void report_failures(ftkv::Store &store) {
    while (std::optional<int> worker = store.next_failure()) {
        say("noticed failure of worker %d\n", *worker);
    }
}

/* Reads worker `victim`'s checkpoint and checks it is whole; prints the verdict line.
 * Throws RecoveryNeeded (before printing) when the store needs a global recovery first. */
bool check_checkpoint(ftkv::Store &store, int victim) {
    std::optional<std::string> got;
    try {
        got = store.get(victim, CHECKPOINT);
    } catch (const ftkv::KeyLost &) {
        say("read rank %d -> NOT FOUND (key lost)\n", victim);
        return false;
    }
    if (!got) {
        say("read rank %d -> NOT FOUND\n", victim);
        return false;
    }
    int rank = -1;
    long iteration = -1;
    std::string first_line = got->substr(0, got->find('\n'));
    if (std::sscanf(first_line.c_str(), "rank %d iteration %ld", &rank, &iteration) != 2) {
        say("read rank %d -> MISMATCH (no checkpoint header)\n", victim);
        return false;
    }
    bool whole = rank == victim && *got == checkpoint(victim, iteration);
    say("read rank %d iteration %ld -> %s\n", victim, iteration, whole ? "MATCH" : "MISMATCH");
    return whole;
}

/* Checks every failed worker's checkpoint once (also of workers that fail meanwhile); true
 * when all matched. */
bool check_failed_workers(ftkv::Store &store) {
    bool all_matched = true;
    std::set<int> checked;
    for (;;) {
        try {
            for (int victim : store.failed()) {
                if (checked.count(victim) != 0) continue;
                all_matched = check_checkpoint(store, victim) && all_matched;
                checked.insert(victim);
            }
            return all_matched;
        } catch (const ftkv::RecoveryNeeded &) {
            global_recovery(store);
        }
    }
}

/* The protocol from the first checkpoint to `done`; the verdict (exit status). */
int run(ftkv::Store &store, double seconds) {
    const int rank = store.worker();
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(seconds));
    std::string value;
    long iteration = 1;
    while (std::chrono::steady_clock::now() < deadline) {
        try {
            report_failures(store);
            value = checkpoint(rank, iteration);
            /* `value` stays unchanged until wait() returned (put_async's buffer rule). */
            store.put_async(CHECKPOINT, value);
            store.wait();
        } catch (const ftkv::RecoveryNeeded &) {
            global_recovery(store);
            continue; /* the same iteration again */
        }
        say("acked %ld\n", iteration);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++iteration;
    }
    say("wrote %ld checkpoints\n", iteration - 1);

    for (;;) {
        try {
            store.follow();
            break;
        } catch (const ftkv::RecoveryNeeded &) {
            global_recovery(store);
        }
    }
    report_failures(store);
    bool all_matched = check_failed_workers(store);
    const ftkv::Counters counters = store.counters();
    say("counters puts=%llu repairs=%llu keys_moved=%llu global_recoveries=%llu\n",
        static_cast<unsigned long long>(counters.puts),
        static_cast<unsigned long long>(counters.repairs),
        static_cast<unsigned long long>(counters.keys_moved),
        static_cast<unsigned long long>(counters.global_recoveries));
    /* After a failure the barrier reports RecoveryNeeded even when localized recovery
     * repaired the copies (the dead worker is still a member of the store's communicator),
     * so the survivors end with a global recovery here. Another survivor may have entered
     * that recovery from its reads and still comes to sync afterwards: every survivor syncs
     * again after recovering, so that all of them leave this barrier together and free the
     * store together. */
    for (;;) {
        try {
            store.sync();
            break;
        } catch (const ftkv::RecoveryNeeded &) {
            global_recovery(store);
        }
    }
    say("done\n");
    return all_matched ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
    int provided = 0;
    check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");

    ftkv::Store store(nullptr);
    try {
        store = ftkv::Store(MPI_COMM_WORLD, ftkv::Config({"checkpoint"}, 2).localized(1));
    } catch (const ftkv::Error &e) {
        fail(nullptr, e);
    }
    say("ready pid=%d\n", static_cast<int>(getpid()));

    int verdict = 1;
    try {
        verdict = run(store, seconds);
    } catch (const ftkv::Error &e) {
        fail(&store, e);
    }

    end_status = verdict;
    signal(SIGALRM, leave_at_end_bound);
    alarm(END_BOUND_SECONDS);
    try {
        store.free();
    } catch (const ftkv::Error &e) {
        std::fprintf(stderr, "checkpoint: freeing the store: %s\n", e.what());
    }
    end_step = 1;
    /* With a dead member MPI_Finalize may report the failure; the checkpoints were checked. */
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) std::fprintf(stderr, "checkpoint: MPI_Finalize returned %d\n", rc);
    return verdict;
}
