/* ftkv: a resilient in-memory key-value store on MPI with ULFM. The C++ API (C++17).
 *
 * A header-only wrapper over the C API of ftkv.h: `ftkv::Store` owns a store handle (RAII,
 * move-only), `ftkv::Config` builds its configuration, `ftkv::Txn` owns a transaction.
 * Every member states its completion and its failure in a line or two; the C function it
 * calls (named in each comment) documents the details, which hold here unchanged. Values are
 * `std::string_view`, (pointer, length) or, in C++20, `std::span<const std::byte>`.
 *
 *     ftkv::Store store(MPI_COMM_WORLD, ftkv::Config({"checkpoint"}, 2).localized(1));
 *     store.put(0, state);                          // every copy holds it
 *     std::optional<std::string> v = store.get(peer, 0);
 *
 * Errors are exceptions: `ftkv::Error` (a `std::runtime_error`) carries the C status
 * (`status()`) and the text of `ftkv_last_error()` (`detail()`); `ftkv::RecoveryNeeded`,
 * `ftkv::KeyLost` and `ftkv::Contended` derive from it, so that recovering after a failure is
 * a catch clause:
 *
 *     try { store.put(0, state); }
 *     catch (const ftkv::RecoveryNeeded &) { store.recover(); store.put(0, state); }
 *
 * Why exceptions rather than returned statuses: a constructor (opening a store, which is the
 * call most likely to be misconfigured) can only report through one, an RAII wrapper whose
 * every call must be checked is the case exceptions are for, and a failure of one process is
 * rare and handled in one place (the recovery), not after every call. The C status is still
 * there on each exception. Outcomes that are not failures are values, never exceptions: a key
 * that holds no value (`std::nullopt`), a transaction whose condition did not hold
 * (`Outcome::Aborted`), no new failure to report (`std::nullopt`). A transaction that met a
 * key locked for too long is `Contended`, an exception, as its C status is a failure (nothing
 * was written; run it again).
 *
 * Rules that come from the C API:
 * - A `Store` is used by one thread at a time (it may move between threads).
 * - Opening and freeing a store, `sync`, `recover` are collective over the store's live
 *   workers: every one of them calls them, in the same order.
 * - MPI must be initialised with `MPI_THREAD_MULTIPLE` before a store is opened, and the
 *   program keeps owning the communicator it passes (ftkv works on a duplicate).
 * - Nothing here throws from a destructor, and no C++ exception crosses into ftkv (an
 *   exception thrown by an event handler is dropped).
 *
 * Build: include this header (it includes ftkv.h, which sits next to it, and so <mpi.h>),
 * compile as C++17 or later with Open MPI's include directory (mpicxx does), and link the
 * ftkv library as a C program does. */

#ifndef FTKV_HPP
#define FTKV_HPP

#include "ftkv.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if __cplusplus >= 202002L && __has_include(<span>)
#include <span>
#if defined(__cpp_lib_span)
/* 1 when the std::span<const std::byte> overloads are declared. */
#define FTKV_HPP_SPAN 1
#endif
#endif

namespace ftkv {

/* ------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------ */

/* A call of the C API that failed: its status, the C function, and ftkv's explanation. */
class Error : public std::runtime_error {
public:
    /* `call` is the C function's name (a string literal); `detail` the text of
     * ftkv_last_error() right after it failed ("" if none). */
    Error(ftkv_status status, const char *call, std::string detail)
        : std::runtime_error(compose(status, call, detail)),
          status_(status),
          call_(call),
          detail_(std::make_shared<const std::string>(std::move(detail))) {}

    /* The C status (never FTKV_OK, FTKV_NOT_FOUND or FTKV_BUFFER_TOO_SMALL). */
    ftkv_status status() const noexcept { return status_; }
    /* The C function that returned it, e.g. "ftkv_put". */
    const char *call() const noexcept { return call_; }
    /* ftkv_last_error() of the failed call: what went wrong in words (may be ""). */
    const std::string &detail() const noexcept { return *detail_; }

private:
    static std::string compose(ftkv_status status, const char *call, const std::string &detail) {
        std::string text = call;
        text += ": ";
        text += ftkv_status_message(status);
        if (!detail.empty()) {
            text += ": ";
            text += detail;
        }
        return text;
    }

    ftkv_status status_;
    const char *call_;
    /* Shared so that copying the exception cannot throw. */
    std::shared_ptr<const std::string> detail_;
};

/* FTKV_RECOVERY_NEEDED: a process failed and the store needs a (global) recovery: every
 * survivor calls Store::recover before using it again. With localized recovery the store
 * only reports it when it fell back to global recovery (Store::follow repairs otherwise). */
class RecoveryNeeded : public Error {
public:
    using Error::Error;
};

/* FTKV_KEY_LOST: no copy of the key survived a recovery and its owner has not written it
 * since. */
class KeyLost : public Error {
public:
    using Error::Error;
};

/* FTKV_CONTENDED: a transaction's key stayed locked by others for the whole bound; nothing
 * was written, the transaction may be run again. */
class Contended : public Error {
public:
    using Error::Error;
};

namespace detail {

/* Throws the exception for a failed `status` of C function `call`. */
[[noreturn]] inline void fail(ftkv_status status, const char *call) {
    const char *why = ftkv_last_error();
    std::string text = why != nullptr ? why : "";
    switch (status) {
    case FTKV_RECOVERY_NEEDED:
        throw RecoveryNeeded(status, call, std::move(text));
    case FTKV_KEY_LOST:
        throw KeyLost(status, call, std::move(text));
    case FTKV_CONTENDED:
        throw Contended(status, call, std::move(text));
    default:
        throw Error(status, call, std::move(text));
    }
}

/* Throws unless `status` is FTKV_OK. */
inline void check(ftkv_status status, const char *call) {
    if (status != FTKV_OK) fail(status, call);
}

/* Whether T is a container that owns its bytes (a temporary of it would dangle). */
template <class T>
struct owns_bytes : std::false_type {};
template <class C, class Tr, class A>
struct owns_bytes<std::basic_string<C, Tr, A>> : std::true_type {};
template <class T, class A>
struct owns_bytes<std::vector<T, A>> : std::true_type {};

/* Enabled for an rvalue of an owning container: the argument of the deleted put_async
 * overload that keeps a temporary from being written asynchronously. */
template <class T>
using if_temporary_buffer =
    std::enable_if_t<!std::is_lvalue_reference_v<T> && owns_bytes<std::remove_cv_t<T>>::value>;

/* Reads a value with `read(buf, cap, &len)` (a C call that reports FTKV_BUFFER_TOO_SMALL with
 * the length it needs) into `out`, growing it until it fits. True: found; false: not found. */
template <class Read>
bool read_value(std::string &out, const char *call, Read read) {
    std::size_t cap = std::max<std::size_t>(out.capacity(), 64 << 10);
    for (;;) {
        out.resize(cap);
        std::uintptr_t len = 0;
        ftkv_status status = read(&out[0], static_cast<std::uintptr_t>(cap), &len);
        if (status == FTKV_OK) {
            out.resize(static_cast<std::size_t>(len));
            return true;
        }
        if (status == FTKV_NOT_FOUND) {
            out.clear();
            return false;
        }
        if (status != FTKV_BUFFER_TOO_SMALL) {
            out.clear();
            fail(status, call);
        }
        /* The value may have grown since its length was reported: never ask twice for the
         * same room. */
        cap = std::max<std::size_t>(static_cast<std::size_t>(len), cap * 2);
    }
}

}  // namespace detail

/* ------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------ */

/* How the store recovers from a failed process (ftkv_recovery). */
enum class Recovery {
    /* Every survivor calls Store::recover after RecoveryNeeded; the store shrinks to them. */
    Global = FTKV_RECOVERY_GLOBAL,
    /* The survivors keep going: the failed worker's copies move to reserve holders in the
     * background (Store::follow waits for it); global recovery only as a fallback. */
    Localized = FTKV_RECOVERY_LOCALIZED,
};

/* How the store's failure detector watches the workers (ftkv_detection). */
enum class Detection {
    Bitmap = FTKV_DETECTION_BITMAP,
    Ping = FTKV_DETECTION_PING,
};

/* A store's configuration: kind names, copies and the settings of ftkv_config. It owns the
 * kind names, so they stay alive during the open call. Settings not set keep the defaults of
 * ftkv_config_default (global recovery, no reserve holders, 64 KiB initial size, 64 MiB
 * largest value, bitmap detection, 2 s watchdog, 10 s recovery watchdog, suspicion from the
 * environment, no transactions). Every rank must open the store with the same configuration.
 *
 *     ftkv::Config({"checkpoint", "progress"}, 2).localized(1).max_value(1 << 20)
 */
class Config {
public:
    /* `kinds`: the kind names (kind index i is kinds[i]); `copies`: copies of every key, on
     * other ranks. Validity is checked when the store is opened. */
    Config(std::vector<std::string> kinds, std::size_t copies)
        : kinds_(std::move(kinds)), copies_(copies) {}
    Config(std::initializer_list<std::string_view> kinds, std::size_t copies)
        : kinds_(kinds.begin(), kinds.end()), copies_(copies) {}

    /* Bytes per slot expected to be used. */
    Config &initial_size(std::size_t bytes) {
        initial_size_ = bytes;
        return *this;
    }
    /* The largest value a put accepts. */
    Config &max_value(std::size_t bytes) {
        max_value_ = bytes;
        return *this;
    }
    Config &recovery(Recovery recovery) {
        recovery_ = recovery;
        return *this;
    }
    /* Localized recovery with `reserve_holders` reserve holders per copy (at least 1). */
    Config &localized(std::size_t reserve_holders = 1) {
        recovery_ = Recovery::Localized;
        reserve_holders_ = reserve_holders;
        return *this;
    }
    /* Global recovery (the default). */
    Config &global() {
        recovery_ = Recovery::Global;
        return *this;
    }
    /* Reserve holders per copy; localized recovery needs at least 1. */
    Config &reserve_holders(std::size_t n) {
        reserve_holders_ = n;
        return *this;
    }
    Config &detection(Detection detection) {
        detection_ = detection;
        return *this;
    }
    Config &watchdog(std::chrono::milliseconds bound) {
        watchdog_ms_ = to_ms(bound);
        return *this;
    }
    Config &recovery_watchdog(std::chrono::milliseconds bound) {
        recovery_watchdog_ms_ = to_ms(bound);
        return *this;
    }
    /* Must equal Open MPI's heartbeat detector timeout. */
    Config &suspicion(std::chrono::milliseconds timeout) {
        suspicion_ms_ = to_ms(timeout);
        return *this;
    }
    /* Whether the store runs transactions (needs localized recovery). */
    Config &transactions(bool on = true) {
        transactions_ = on;
        return *this;
    }

    const std::vector<std::string> &kinds() const noexcept { return kinds_; }
    std::size_t copies() const noexcept { return copies_; }

    /* The index of kind `name` (the `kind` argument of the store's calls). Throws Error
     * (FTKV_INVALID_ARGUMENT) for a name that is not among the kinds. */
    std::uint16_t kind(std::string_view name) const {
        for (std::size_t i = 0; i < kinds_.size(); ++i) {
            if (kinds_[i] == name) return static_cast<std::uint16_t>(i);
        }
        throw Error(FTKV_INVALID_ARGUMENT, "ftkv::Config::kind",
                    "no kind named \"" + std::string(name) + "\"");
    }

    /* The C configuration: ftkv_config_default with the settings made here. `pointers`
     * receives the kind name pointers ftkv_config.kinds points to; it and this Config must
     * outlive every use of the result. */
    ftkv_config to_c(std::vector<const char *> &pointers) const {
        pointers.clear();
        for (const std::string &kind : kinds_) pointers.push_back(kind.c_str());
        ftkv_config c = ftkv_config_default(pointers.data(), pointers.size(), copies_);
        if (initial_size_) c.initial_size = *initial_size_;
        if (max_value_) c.max_value = *max_value_;
        if (recovery_) c.recovery = static_cast<ftkv_recovery>(*recovery_);
        if (reserve_holders_) c.reserve_holders = *reserve_holders_;
        if (detection_) c.detection = static_cast<ftkv_detection>(*detection_);
        if (watchdog_ms_) c.watchdog_ms = *watchdog_ms_;
        if (recovery_watchdog_ms_) c.recovery_watchdog_ms = *recovery_watchdog_ms_;
        if (suspicion_ms_) c.suspicion_ms = *suspicion_ms_;
        if (transactions_) c.transactions = *transactions_ ? 1 : 0;
        return c;
    }

private:
    static std::uint64_t to_ms(std::chrono::milliseconds d) {
        return d.count() < 0 ? 0 : static_cast<std::uint64_t>(d.count());
    }

    std::vector<std::string> kinds_;
    std::size_t copies_;
    std::optional<std::size_t> initial_size_;
    std::optional<std::size_t> max_value_;
    std::optional<Recovery> recovery_;
    std::optional<std::size_t> reserve_holders_;
    std::optional<Detection> detection_;
    std::optional<std::uint64_t> watchdog_ms_;
    std::optional<std::uint64_t> recovery_watchdog_ms_;
    std::optional<std::uint64_t> suspicion_ms_;
    std::optional<bool> transactions_;
};

/* ------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------ */

/* A handler of the store's events (warnings, a process ending itself, recovery steps and
 * waits): the kind and the message (one line, valid during the call). It runs on whichever
 * thread raised the event, the program's or one of ftkv's, so it must be thread-safe, quick,
 * and must not call ftkv; an exception it throws is dropped. */
using EventHandler = std::function<void(ftkv_event_kind kind, std::string_view message)>;

namespace detail {

/* The process-wide std::function handler, which the trampoline below reads. */
struct EventSlot {
    std::mutex mutex;
    std::shared_ptr<const EventHandler> handler;
};

/* Never destroyed: an ftkv thread may still report an event while the program's static
 * objects are destroyed at exit. */
inline EventSlot &event_slot() {
    static EventSlot *slot = new EventSlot;
    return *slot;
}

/* The C handler that forwards to the EventSlot `user` points to; it holds its own reference
 * to the handler, so replacing the handler meanwhile is safe. */
inline void event_trampoline(ftkv_event_kind kind, const char *message, void *user) noexcept {
    auto *slot = static_cast<EventSlot *>(user);
    std::shared_ptr<const EventHandler> handler;
    try {
        std::lock_guard<std::mutex> lock(slot->mutex);
        handler = slot->handler;
    } catch (...) {
        return;
    }
    if (!handler || !*handler) return;
    try {
        (*handler)(kind, message != nullptr ? std::string_view(message) : std::string_view());
    } catch (...) {
        /* No exception may unwind into ftkv. */
    }
}

}  // namespace detail

/* Installs a C handler with its `user` pointer for the whole process (ftkv_set_event_handler);
 * `handler` NULL restores the default (a line on stderr). Replaces a std::function handler.
 * The handler must not let an exception out (declare it noexcept): it is called from ftkv's
 * threads through C. Completion: from the next event on. Failure: throws Error. */
inline void set_event_handler(ftkv_event_handler handler, void *user) {
    detail::check(ftkv_set_event_handler(handler, user), "ftkv_set_event_handler");
    detail::EventSlot &slot = detail::event_slot();
    std::lock_guard<std::mutex> lock(slot.mutex);
    slot.handler.reset();
}

/* Installs `handler` for the whole process (it is kept in a static and called through a
 * captureless C trampoline); an empty one restores the default (a line on stderr).
 * Completion: from the next event on; a call of the previous handler in progress on another
 * thread finishes with it. Failure: throws Error (the previous handler stays). */
inline void set_event_handler(EventHandler handler) {
    if (!handler) {
        set_event_handler(nullptr, nullptr);
        return;
    }
    detail::EventSlot &slot = detail::event_slot();
    auto next = std::make_shared<const EventHandler>(std::move(handler));
    std::shared_ptr<const EventHandler> previous;
    {
        std::lock_guard<std::mutex> lock(slot.mutex);
        previous = slot.handler;
        slot.handler = std::move(next);
    }
    ftkv_status status = ftkv_set_event_handler(&detail::event_trampoline, &slot);
    if (status != FTKV_OK) {
        std::lock_guard<std::mutex> lock(slot.mutex);
        slot.handler = std::move(previous);
        detail::fail(status, "ftkv_set_event_handler");
    }
}

/* Restores the default handler (a line on stderr). Failure: throws Error. */
inline void reset_event_handler() { set_event_handler(nullptr, nullptr); }

/* ------------------------------------------------------------------------------------------
 * Store
 * ------------------------------------------------------------------------------------------ */

/* The counters of a worker's store handle (ftkv_counters: puts, deletes, gets, bytes written,
 * failures noticed, global recoveries, keys lost, repairs, keys and bytes moved, transactions
 * committed and aborted). */
using Counters = ftkv_counters;

/* How a transaction ended (ftkv_txn_outcome). */
enum class Outcome {
    /* Every write applied; the reads are in Txn::result. */
    Committed,
    /* A condition did not hold (Txn::aborted_on names it); nothing written. */
    Aborted,
};

/* How this worker's own interrupted transaction ended (ftkv_txn_decision). */
enum class Decision {
    /* There was none. */
    None,
    Committed,
    Aborted,
};

/* A key: its owner (worker) and its kind index. */
struct Key {
    int owner;
    std::uint16_t kind;
};

class Txn;

/* A store handle: this worker's part of a store on a communicator. Keys are (owner worker,
 * kind index); a worker writes its own keys (or, handed, another's) and reads any key, also a
 * failed worker's. Move-only; the destructor frees the store (collectively) unless it was
 * freed or abandoned.
 *
 * Freeing is collective over the store's live workers (ftkv_store_free) and may fail: every
 * live worker must destroy (or free()) its Store at the same point of the program. After a
 * failure that was not recovered, call abandon() (no collective call) instead; in particular
 * an exception that unwinds past a Store would free it collectively while the other workers
 * are elsewhere, so catch it where the Store lives and abandon there. The destructor ignores
 * a failed free (destructors do not throw); free() reports it. */
class Store {
public:
    /* Opens a store collectively on every rank of `comm` (ftkv_store_open); `config`'s kind
     * names live through the call. Completion: returns on every rank once every rank opened
     * its part. Failure: throws Error: FTKV_INVALID_CONFIG when the configurations differ or
     * one is invalid, FTKV_MPI_ERROR when MPI is not ready (MPI_THREAD_MULTIPLE) or a rank
     * failed meanwhile. */
    Store(MPI_Comm comm, const Config &config) {
        std::vector<const char *> kinds;
        ftkv_config c = config.to_c(kinds);
        ftkv_store *out = nullptr;
        detail::check(ftkv_store_open(comm, &c, &out), "ftkv_store_open");
        handle_ = out;
    }

    /* Takes over `handle` (from ftkv_store_open or ftkv_store_create; NULL: an empty Store). */
    explicit Store(ftkv_store *handle) noexcept : handle_(handle) {}

    Store(const Store &) = delete;
    Store &operator=(const Store &) = delete;
    Store(Store &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    /* Frees the store this one held (collectively, as the destructor does), then takes over
     * `other`'s. */
    Store &operator=(Store &&other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }

    /* Frees the store collectively (ftkv_store_free) unless it is empty (moved from, freed,
     * abandoned or released); a failure is ignored. See the class comment. */
    ~Store() { reset(); }

    /* Frees the store collectively over its live workers (ftkv_store_free; a pending
     * put_async is completed from its first copy, unacknowledged; after a failure not yet
     * recovered the store is abandoned instead). Completion: returns once freed; the Store is
     * empty. Failure: throws Error; the handle is gone either way. No-op on an empty Store. */
    void free() {
        ftkv_store *handle = std::exchange(handle_, nullptr);
        if (handle != nullptr) detail::check(ftkv_store_free(handle), "ftkv_store_free");
    }

    /* Leaves the store without any collective call (ftkv_store_abandon; its memory stays
     * allocated until the process ends): for a worker that ends after a failure that was not
     * recovered. A pending put_async is not completed. Completion: the Store is empty,
     * nothing is freed at destruction. Never fails (a status is ignored). */
    void abandon() noexcept {
        ftkv_store *handle = std::exchange(handle_, nullptr);
        if (handle != nullptr) (void)ftkv_store_abandon(handle);
    }

    /* Gives up ownership: returns the C handle, the Store is empty. */
    ftkv_store *release() noexcept { return std::exchange(handle_, nullptr); }

    /* The C handle (NULL when empty), for calls of ftkv.h not wrapped here. */
    ftkv_store *handle() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

    /* This rank's worker id (its rank in the communicator the store was opened on); -1 when
     * empty (ftkv_store_worker). */
    int worker() const noexcept { return ftkv_store_worker(handle_); }

    /* Writes `value` under this worker's own key of kind `kind` (ftkv_put); refused while a
     * put_async is pending. Completion: returns once every copy holds it (with localized
     * recovery a failed holder is replaced first). Failure: throws; RecoveryNeeded means a
     * process failed and the store needs global recovery: the new value may be on some
     * holders, the previous one is intact, and after recover() a get returns one of the two;
     * Error(FTKV_INVALID_ARGUMENT) changes nothing. */
    void put(std::uint16_t kind, const void *data, std::size_t len) {
        detail::check(ftkv_put(handle_, kind, data, len), "ftkv_put");
    }
    void put(std::uint16_t kind, std::string_view value) { put(kind, value.data(), value.size()); }
#ifdef FTKV_HPP_SPAN
    void put(std::uint16_t kind, std::span<const std::byte> value) {
        put(kind, value.data(), value.size());
    }
#endif

    /* Starts writing `value` under this worker's own key of kind `kind` (ftkv_put_async).
     * Completion: returns once the first copy holds it; the other copies are written in the
     * background until wait() returns. One pending put per store: until wait(), the store
     * takes only wait(), the queries (worker, needs_recovery, failed, next_failure, counters)
     * and sync, recover, free, abandon (which complete the put from its first copy,
     * unacknowledged); other calls throw Error (FTKV_INVALID_ARGUMENT). Failure: throws as
     * put(); until wait() returned, a failure of this worker leaves the new version or the
     * previous one (never a mix).
     *
     * Buffer lifetime: the bytes of `value` must stay allocated and unchanged until wait()
     * returned. Passing a temporary string or vector does not compile (see the deleted
     * overload). */
    void put_async(std::uint16_t kind, const void *data, std::size_t len) {
        detail::check(ftkv_put_async(handle_, kind, data, len), "ftkv_put_async");
    }
    void put_async(std::uint16_t kind, std::string_view value) {
        put_async(kind, value.data(), value.size());
    }
#ifdef FTKV_HPP_SPAN
    void put_async(std::uint16_t kind, std::span<const std::byte> value) {
        put_async(kind, value.data(), value.size());
    }
#endif
    /* A temporary would be destroyed while its bytes are still being copied. */
    template <class T, class = detail::if_temporary_buffer<T>>
    void put_async(std::uint16_t kind, T &&temporary) = delete;

    /* Completes the pending put_async (ftkv_wait). Completion: returns once every copy holds
     * the value (at once when none is pending), as put() would. Failure: throws as put(). */
    void wait() { detail::check(ftkv_wait(handle_), "ftkv_wait"); }

    /* A collective barrier over the live workers (ftkv_sync); a pending put_async is completed
     * from its first copy first (unacknowledged: wait() before to have it acknowledged).
     * Completion: returns once every live worker called it; every put acknowledged before it
     * on any worker is visible to every get after it. Failure: throws RecoveryNeeded when a
     * worker failed, with localized recovery too (every survivor recovers, then calls it
     * again if it needs the barrier). */
    void sync() { detail::check(ftkv_sync(handle_), "ftkv_sync"); }

    /* Deletes this worker's own key of kind `kind` (ftkv_delete; `delete` is a C++ keyword).
     * Completion and failure as put(). */
    void erase(std::uint16_t kind) { detail::check(ftkv_delete(handle_, kind), "ftkv_delete"); }

    /* Writes `value` under `owner`'s key of kind `kind` as a non-owner (ftkv_put_handed): the
     * caller holds the key by an outer lock, one writer at a time. Completion and failure as
     * put(). */
    void put_handed(int owner, std::uint16_t kind, const void *data, std::size_t len) {
        detail::check(ftkv_put_handed(handle_, owner, kind, data, len), "ftkv_put_handed");
    }
    void put_handed(int owner, std::uint16_t kind, std::string_view value) {
        put_handed(owner, kind, value.data(), value.size());
    }
#ifdef FTKV_HPP_SPAN
    void put_handed(int owner, std::uint16_t kind, std::span<const std::byte> value) {
        put_handed(owner, kind, value.data(), value.size());
    }
#endif

    /* Deletes `owner`'s key of kind `kind` as a non-owner (ftkv_delete_handed), under the
     * same outer lock as put_handed. Completion and failure as put(). */
    void erase_handed(int owner, std::uint16_t kind) {
        detail::check(ftkv_delete_handed(handle_, owner, kind), "ftkv_delete_handed");
    }

    /* Reads the newest value of key (`owner`, `kind`) from its live holders (ftkv_get), any
     * owner's, also a failed one's (after recover(), or at once with localized recovery);
     * refused while a put_async is pending. Completion: the value, or std::nullopt
     * when the key holds none (never written, or deleted); the buffer grows to the length
     * FTKV_BUFFER_TOO_SMALL reports. Failure: throws RecoveryNeeded after a failure not yet
     * recovered, KeyLost when no copy survived. */
    std::optional<std::string> get(int owner, std::uint16_t kind) {
        std::string value;
        if (!get_into(owner, kind, value)) return std::nullopt;
        return value;
    }

    /* get() into `out`, reusing its capacity: true with the value in `out`, false (and `out`
     * empty) when the key holds none. Failure as get(). */
    bool get_into(int owner, std::uint16_t kind, std::string &out) {
        ftkv_store *handle = handle_;
        return detail::read_value(out, "ftkv_get",
                                  [&](void *buf, std::uintptr_t cap, std::uintptr_t *len) {
                                      return ftkv_get(handle, owner, kind, buf, cap, len);
                                  });
    }

    /* Localized recovery: brings this worker's routes up to every failure noticed, waiting
     * for the repairer thread that moves the failed workers' copies (ftkv_follow); call it
     * before reading a failed worker's keys. Refused while a put_async is pending. With global
     * recovery it only reports a failure not yet recovered. Completion: returns once
     * followed. Failure: throws RecoveryNeeded when the store fell back to global recovery
     * (recover()). */
    void follow() { detail::check(ftkv_follow(handle_), "ftkv_follow"); }

    /* The next failed worker this call has not returned before (ftkv_next_failure; the
     * smallest new one), so each failure is learnt once. A query: never waits, and
     * may be called while a put_async is pending. Completion: the worker, or std::nullopt when no failure is
     * new. Failure: throws Error (an empty Store). */
    std::optional<int> next_failure() {
        int worker = -1;
        ftkv_status status = ftkv_next_failure(handle_, &worker);
        if (status == FTKV_NOT_FOUND) return std::nullopt;
        detail::check(status, "ftkv_next_failure");
        return worker;
    }

    /* Every failed worker this rank knows of, ascending (ftkv_failed). A query: never waits.
     * Failure: throws Error (an empty Store). */
    std::vector<int> failed() {
        std::vector<int> workers(8);
        for (;;) {
            std::uintptr_t count = 0;
            detail::check(ftkv_failed(handle_, workers.data(), workers.size(), &count),
                          "ftkv_failed");
            bool complete = count <= workers.size();
            workers.resize(static_cast<std::size_t>(count));
            if (complete) return workers;
        }
    }

    /* Whether a failure was noticed that needs recover() (ftkv_needs_recovery); with
     * localized recovery only once the store fell back to global recovery. A query.
     * Failure: throws Error(FTKV_INVALID_ARGUMENT) on an empty Store. */
    bool needs_recovery() const {
        int needs = ftkv_needs_recovery(handle_);
        if (needs < 0) {
            throw Error(FTKV_INVALID_ARGUMENT, "ftkv_needs_recovery", "the Store is empty");
        }
        return needs != 0;
    }

    /* Recovers the store collectively over the survivors (ftkv_recover): every survivor calls
     * it once it saw RecoveryNeeded (or needs_recovery()); a survivor that does not holds the
     * others in it. Completion: returns on every survivor with the newest surviving version
     * of every key on its new holders; a failure during the recovery restarts it inside.
     * Failure: throws Error (FTKV_RECOVERY_FAILED when too few ranks are left). */
    void recover() { detail::check(ftkv_recover(handle_), "ftkv_recover"); }

    /* This worker's counters (ftkv_counters_get). A query. Failure: throws Error (an empty
     * Store). */
    Counters counters() {
        Counters out{};
        detail::check(ftkv_counters_get(handle_, &out), "ftkv_counters_get");
        return out;
    }

    /* Runs `txn` atomically (ftkv_transaction; the store needs transactions and localized
     * recovery). Completion: Outcome::Committed once every write is on every live holder
     * (the reads are in txn.result), Outcome::Aborted when a condition did not hold (nothing
     * written; txn.aborted_on names it). Failure: throws Contended when a key stayed locked
     * for the whole bound (nothing written), RecoveryNeeded when the store fell back to global
     * recovery: the transaction's record decides, finish_transactions() after recover()
     * reports how it ended. */
    Outcome transaction(Txn &txn);

    /* Resolves failed coordinators' open transactions this worker is backup of
     * (ftkv_resolve_transactions). Completion: how many it resolved. Failure: throws Error
     * (RecoveryNeeded as follow()). */
    std::size_t resolve_transactions() {
        std::uintptr_t resolved = 0;
        detail::check(ftkv_resolve_transactions(handle_, &resolved), "ftkv_resolve_transactions");
        return static_cast<std::size_t>(resolved);
    }

    /* After every recover(): finishes the transactions the failures left half done whose
     * decision this worker holds (ftkv_finish_transactions); every survivor calls it before
     * anyone reads keys transactions write. Completion: how this worker's own transaction
     * ended whose transaction() call threw (Decision::None: there was none). Failure: throws
     * RecoveryNeeded on a new failure (recover, then call it again: it is idempotent), KeyLost
     * when this worker's own record lost every copy. */
    Decision finish_transactions() {
        ftkv_txn_decision decision = FTKV_TXN_NONE;
        detail::check(ftkv_finish_transactions(handle_, &decision), "ftkv_finish_transactions");
        switch (decision) {
        case FTKV_TXN_DECIDED_COMMIT:
            return Decision::Committed;
        case FTKV_TXN_DECIDED_ABORT:
            return Decision::Aborted;
        default:
            return Decision::None;
        }
    }

private:
    void reset() noexcept {
        ftkv_store *handle = std::exchange(handle_, nullptr);
        if (handle != nullptr) (void)ftkv_store_free(handle);
    }

    ftkv_store *handle_ = nullptr;
};

/* ------------------------------------------------------------------------------------------
 * Transactions
 * ------------------------------------------------------------------------------------------ */

/* A value read by a committed transaction. */
struct ReadResult {
    /* The value; std::nullopt when the key held none. */
    std::optional<std::string> value;
    /* Its version (0: never written). */
    std::uint64_t version = 0;
};

/* A transaction (ftkv_txn): built with reads, conditions and writes, run by Store::transaction
 * (or run()), then its reads are looked at. Move-only; the destructor frees it. The builder
 * methods copy their values into the transaction; each throws Error(FTKV_INVALID_ARGUMENT)
 * for an invalid argument (nothing added), and Error on a moved-from Txn. */
class Txn {
public:
    /* An empty transaction (ftkv_txn_new, which never fails). */
    Txn() : handle_(ftkv_txn_new()) {}
    Txn(const Txn &) = delete;
    Txn &operator=(const Txn &) = delete;
    Txn(Txn &&other) noexcept
        : handle_(std::exchange(other.handle_, nullptr)), reads_(std::exchange(other.reads_, 0)) {}
    Txn &operator=(Txn &&other) noexcept {
        if (this != &other) {
            ftkv_txn_free(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
            reads_ = std::exchange(other.reads_, 0);
        }
        return *this;
    }
    ~Txn() { ftkv_txn_free(handle_); }

    /* The C handle, for calls of ftkv.h not wrapped here. */
    ftkv_txn *handle() const noexcept { return handle_; }

    /* Reads key (`owner`, `kind`) (ftkv_txn_read). Returns the read's index for result(). */
    std::size_t read(int owner, std::uint16_t kind) {
        detail::check(ftkv_txn_read(handle_, owner, kind), "ftkv_txn_read");
        return reads_++;
    }
    /* How many reads the transaction has. */
    std::size_t reads() const noexcept { return reads_; }

    /* Condition: the key's newest version is `version` (0: never written)
     * (ftkv_txn_expect_version). */
    Txn &expect_version(int owner, std::uint16_t kind, std::uint64_t version) {
        detail::check(ftkv_txn_expect_version(handle_, owner, kind, version),
                      "ftkv_txn_expect_version");
        return *this;
    }

    /* Condition: the key holds exactly this value (ftkv_txn_expect_value). */
    Txn &expect_value(int owner, std::uint16_t kind, const void *data, std::size_t len) {
        detail::check(ftkv_txn_expect_value(handle_, owner, kind, data, len),
                      "ftkv_txn_expect_value");
        return *this;
    }
    Txn &expect_value(int owner, std::uint16_t kind, std::string_view value) {
        return expect_value(owner, kind, value.data(), value.size());
    }
#ifdef FTKV_HPP_SPAN
    Txn &expect_value(int owner, std::uint16_t kind, std::span<const std::byte> value) {
        return expect_value(owner, kind, value.data(), value.size());
    }
#endif

    /* Condition: the key holds no value (deleted or never written) (ftkv_txn_expect_absent). */
    Txn &expect_absent(int owner, std::uint16_t kind) {
        detail::check(ftkv_txn_expect_absent(handle_, owner, kind), "ftkv_txn_expect_absent");
        return *this;
    }

    /* Writes the key if the transaction commits (ftkv_txn_write). */
    Txn &write(int owner, std::uint16_t kind, const void *data, std::size_t len) {
        detail::check(ftkv_txn_write(handle_, owner, kind, data, len), "ftkv_txn_write");
        return *this;
    }
    Txn &write(int owner, std::uint16_t kind, std::string_view value) {
        return write(owner, kind, value.data(), value.size());
    }
#ifdef FTKV_HPP_SPAN
    Txn &write(int owner, std::uint16_t kind, std::span<const std::byte> value) {
        return write(owner, kind, value.data(), value.size());
    }
#endif

    /* Deletes the key if the transaction commits (ftkv_txn_delete). */
    Txn &erase(int owner, std::uint16_t kind) {
        detail::check(ftkv_txn_delete(handle_, owner, kind), "ftkv_txn_delete");
        return *this;
    }

    /* Runs the transaction on `store`: Store::transaction (completion and failure there). */
    Outcome run(Store &store) { return store.transaction(*this); }

    /* After a commit: the value and version of read `i` (ftkv_txn_result). Failure: throws
     * Error (FTKV_INVALID_ARGUMENT for an index out of range or a transaction that did not
     * commit). */
    ReadResult result(std::size_t i) const {
        ReadResult out;
        std::string value;
        std::uint64_t version = 0;
        const ftkv_txn *handle = handle_;
        bool found = detail::read_value(
            value, "ftkv_txn_result", [&](void *buf, std::uintptr_t cap, std::uintptr_t *len) {
                return ftkv_txn_result(handle, i, buf, cap, len, &version);
            });
        if (found) out.value = std::move(value);
        out.version = version;
        return out;
    }

    /* After an abort: the key whose condition did not hold (ftkv_txn_aborted_on). Failure:
     * throws Error when the transaction did not abort. */
    Key aborted_on() const {
        Key key{-1, 0};
        detail::check(ftkv_txn_aborted_on(handle_, &key.owner, &key.kind), "ftkv_txn_aborted_on");
        return key;
    }

private:
    ftkv_txn *handle_;
    std::size_t reads_ = 0;
};

inline Outcome Store::transaction(Txn &txn) {
    ftkv_txn_outcome outcome = FTKV_TXN_ABORTED;
    detail::check(ftkv_transaction(handle_, txn.handle(), &outcome), "ftkv_transaction");
    return outcome == FTKV_TXN_COMMITTED ? Outcome::Committed : Outcome::Aborted;
}

}  // namespace ftkv

#endif /* FTKV_HPP */
