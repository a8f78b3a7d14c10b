//! A failed job's error, said once. A rank that ends the job on an error or a panic prints one
//! line, `ftkv: rank R: error: <message>` or `ftkv: rank R: panic: <message>`
//! ([`rank_error_line`]), and often every rank ends on the same error. A driver shows each
//! message once, with the ranks that reported it ([`said_once`]): `ftkv: ranks 0-3, 5: <message>`
//! (a panic's message keeps its `panic: `).

use std::collections::BTreeSet;

/// What every rank's error line starts with, before the rank number.
pub const RANK_ERROR_PREFIX: &str = "ftkv: rank ";

/// How a rank ended the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Error,
    Panic,
}

/// The line rank `rank` (`None`: unknown) prints when it ends the job: `ftkv: rank R: error:
/// <message>`, the message's line breaks turned into spaces so that the line stays one line.
pub fn rank_error_line(rank: Option<i32>, ending: Ending, message: &str) -> String {
    let rank = rank.map_or_else(|| "?".to_owned(), |r| r.to_string());
    let kind = match ending {
        Ending::Error => "error",
        Ending::Panic => "panic",
    };
    let parts: Vec<&str> = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    format!("{RANK_ERROR_PREFIX}{rank}: {kind}: {}", parts.join(" "))
}

/// The rank error line within `line` (after Open MPI's `[1,R]<stderr>:` tag, a
/// `[recorded by rank-R]` note or nothing): the rank (`None`: unknown) and what a driver shows
/// of it, the message without `error: ` or with `panic: `.
pub fn find_rank_error(line: &str) -> Option<(Option<usize>, String)> {
    let text = &line[line.find(RANK_ERROR_PREFIX)? + RANK_ERROR_PREFIX.len()..];
    let (rank, rest) = text.split_once(": ")?;
    let rank = match rank {
        "?" => None,
        number => Some(number.parse().ok()?),
    };
    let shown = match rest.strip_prefix("error: ") {
        Some(message) => message,
        None if rest.starts_with("panic: ") => rest,
        None => return None,
    };
    Some((rank, shown.trim_end().to_owned()))
}

/// The rank errors in a job's stderr, in the order they appear.
pub fn rank_errors_in(stderr: &str) -> impl Iterator<Item = (Option<usize>, String)> + '_ {
    stderr.lines().filter_map(find_rank_error)
}

/// What a driver prints of the ranks' errors: each distinct message once, in the order of its
/// first report, after the ranks that reported it (`ftkv: rank 2: <message>`,
/// `ftkv: ranks 0-3, 5: <message>`; an unknown rank is `?`).
pub fn said_once(reports: impl IntoIterator<Item = (Option<usize>, String)>) -> Vec<String> {
    let mut messages: Vec<(String, BTreeSet<Option<usize>>)> = Vec::new();
    for (rank, message) in reports {
        match messages.iter_mut().find(|(m, _)| *m == message) {
            Some((_, ranks)) => {
                ranks.insert(rank);
            }
            None => messages.push((message, BTreeSet::from([rank]))),
        }
    }
    messages
        .iter()
        .map(|(message, ranks)| format!("ftkv: {}: {message}", ranks_label(ranks)))
        .collect()
}

/// `rank 2`, `ranks 0-3, 5`, `ranks 1, ?`: known ranks in runs, an unknown one last.
fn ranks_label(ranks: &BTreeSet<Option<usize>>) -> String {
    let known: Vec<usize> = ranks.iter().flatten().copied().collect();
    let mut parts = runs(&known);
    if ranks.contains(&None) {
        parts.push("?".to_owned());
    }
    let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{noun} {}", parts.join(", "))
}

/// Sorted `ranks` as runs of consecutive numbers: `[0, 1, 2, 5]` → `["0-2", "5"]`.
fn runs(ranks: &[usize]) -> Vec<String> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &rank in ranks {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == rank => *last = rank,
            _ => runs.push((rank, rank)),
        }
    }
    let text = |&(first, last): &(usize, usize)| {
        if first == last {
            first.to_string()
        } else {
            format!("{first}-{last}")
        }
    };
    runs.iter().map(text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case of [`said_once`]: its name, the reports and the lines printed.
    type Case<'a> = (&'a str, Vec<(Option<usize>, String)>, Vec<&'a str>);

    fn reports(pairs: &[(Option<usize>, &str)]) -> Vec<(Option<usize>, String)> {
        pairs.iter().map(|&(rank, message)| (rank, message.to_owned())).collect()
    }

    #[test]
    fn each_message_is_said_once_with_the_ranks_that_reported_it() {
        let table: [Case; 7] = [
            ("no errors", reports(&[]), vec![]),
            ("one rank", reports(&[(Some(2), "store: X")]), vec!["ftkv: rank 2: store: X"]),
            (
                "the same message from several ranks",
                reports(&[
                    (Some(3), "store: X"),
                    (Some(0), "store: X"),
                    (Some(5), "store: X"),
                    (Some(1), "store: X"),
                    (Some(2), "store: X"),
                ]),
                vec!["ftkv: ranks 0-3, 5: store: X"],
            ),
            (
                "different messages each once, in the order of their first report",
                reports(&[(Some(1), "b"), (Some(0), "a"), (Some(2), "b"), (Some(3), "a")]),
                vec!["ftkv: ranks 1-2: b", "ftkv: ranks 0, 3: a"],
            ),
            (
                "a rank reported twice (forwarded and recorded)",
                reports(&[(Some(4), "x"), (Some(4), "x")]),
                vec!["ftkv: rank 4: x"],
            ),
            (
                "an unknown rank comes last",
                reports(&[(None, "x"), (Some(7), "x")]),
                vec!["ftkv: ranks 7, ?: x"],
            ),
            (
                "a panic keeps its kind",
                reports(&[(Some(0), "panic: panicked at a.rs:1:2: boom"), (Some(0), "boom")]),
                vec!["ftkv: rank 0: panic: panicked at a.rs:1:2: boom", "ftkv: rank 0: boom"],
            ),
        ];
        for (case, reports, want) in table {
            assert_eq!(said_once(reports), want, "{case}");
        }
    }

    #[test]
    fn rank_error_lines_are_found_with_and_without_tags() {
        let table = [
            ("[1,2]<stderr>: ftkv: rank 2: error: too large", Some((Some(2), "too large"))),
            (
                "ftkv: rank 0: panic: panicked at b.rs:13",
                Some((Some(0), "panic: panicked at b.rs:13")),
            ),
            ("[recorded by rank-1] ftkv: rank 1: error: lost", Some((Some(1), "lost"))),
            ("ftkv: rank ?: error: no rank", Some((None, "no rank"))),
            ("[1,1]<stderr>: ftkv: rank 1 epoch 0: recovery: revoked", None),
            ("ftkv: ranks 0-3: store: X", None),
            ("noise", None),
        ];
        for (line, want) in table {
            let want = want.map(|(rank, message)| (rank, message.to_owned()));
            assert_eq!(find_rank_error(line), want, "{line:?}");
        }
    }

    #[test]
    fn a_rank_error_line_is_one_line_that_reads_back() {
        let panic = "panicked at src/bench.rs:13:5:\nindex out of bounds\n";
        let line = rank_error_line(Some(3), Ending::Panic, panic);
        assert_eq!(line, "ftkv: rank 3: panic: panicked at src/bench.rs:13:5: index out of bounds");
        let error = rank_error_line(None, Ending::Error, "store: X");
        assert_eq!(error, "ftkv: rank ?: error: store: X");
        assert_eq!(find_rank_error(&error), Some((None, "store: X".to_owned())));
    }
}
