//! The progress of a long run (`demo`, `chaos`, `bench`): a progress bar (indicatif) redrawn in
//! place when stderr is a terminal, plain lines otherwise (a log, CI, a pipe), so that the
//! drivers' output stays readable either way.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One run's progress: `[prefix]`-tagged on stderr.
pub struct Progress {
    prefix: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar of `total` steps (a spinner when `None`) if stderr is a terminal, else plain lines.
    pub fn new(prefix: &str, total: Option<u64>) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| Self::bar(prefix, total));
        Progress { prefix: prefix.to_owned(), bar }
    }

    /// Plain lines whatever stderr is (for runs whose output is parsed).
    pub fn plain(prefix: &str) -> Progress {
        Progress { prefix: prefix.to_owned(), bar: None }
    }

    fn bar(prefix: &str, total: Option<u64>) -> ProgressBar {
        let bar = match total {
            Some(total) => ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()),
            None => ProgressBar::new_spinner(),
        };
        let template = match total {
            Some(_) => "[{prefix}] {elapsed_precise} {wide_bar} {percent:>3}% {msg}",
            None => "[{prefix}] {elapsed_precise} {spinner} {msg}",
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.set_prefix(prefix.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }

    /// Where the run stands: the bar's position and message, or a plain `[prefix] message`.
    pub fn update(&self, position: u64, message: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(position);
                bar.set_message(message.to_owned());
            }
            None => eprintln!("[{}] {message}", self.prefix),
        }
    }

    /// Moves the bar to `position` (plain lines: nothing to show).
    pub fn advance_to(&self, position: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(position);
        }
    }

    /// A line that stays (an event such as a kill): printed above the bar, or plainly.
    pub fn line(&self, message: &str) {
        let text = format!("[{}] {message}", self.prefix);
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Whether a bar is drawn (stderr is a terminal).
    pub fn is_bar(&self) -> bool {
        self.bar.is_some()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_only_on_a_terminal_and_never_when_plain() {
        let progress = Progress::new("demo", Some(10));
        assert_eq!(progress.is_bar(), std::io::stderr().is_terminal());
        assert!(!Progress::plain("chaos").is_bar());
        progress.update(3, "3 of 10");
        progress.line("an event");
    }
}
