//! UTS, the Unbalanced Tree Search benchmark, with the reference implementation's SHA-1
//! splittable random number generator, so that tree sizes equal the published ones.
//!
//! A node is 20 bytes of generator state and a height. The root's state is the SHA-1 of 16 zero
//! bytes followed by the big-endian root id (`-r`); child `i`'s state is the SHA-1 of its
//! parent's state followed by big-endian `i`. A node's random number is the last four state
//! bytes, big-endian, with the sign bit cleared; the number of children follows from it and the
//! tree shape: geometric (`-t 1`) with expected branching `b_i` by depth (`-a`: 0 linear
//! decrease, 1 exponential decrease, 2 cyclic, 3 fixed) until depth `-d`; binomial (`-t 0`) with
//! `-m` children at probability `-q` below a root of `-b` children; hybrid (`-t 2`) geometric
//! down to depth `-f × -d`, binomial below; balanced (`-t 3`).

use sha1::{Digest, Sha1};

/// The tree shapes of the reference (`-t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeType {
    Binomial,
    Geometric,
    Hybrid,
    Balanced,
}

/// How the geometric branching factor changes with depth (`-a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Linear,
    ExpDec,
    Cyclic,
    Fixed,
}

/// A tree's parameters, with the reference's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub tree: TreeType,
    pub shape: Shape,
    /// `-b`: root branching factor (and geometric target).
    pub b0: f64,
    /// `-d`: depth limit of geometric trees (and balanced depth).
    pub depth: u32,
    /// `-r`: the root's seed.
    pub root_id: i32,
    /// `-m`: children of a binomial non-leaf.
    pub non_leaf_bf: u32,
    /// `-q`: probability that a binomial node has children.
    pub non_leaf_prob: f64,
    /// `-f`: fraction of the depth limit where a hybrid tree turns binomial.
    pub shift_depth: f64,
    /// `-g`: how often each child's state is computed (work per node).
    pub granularity: u32,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            tree: TreeType::Geometric,
            shape: Shape::Linear,
            b0: 4.0,
            depth: 6,
            root_id: 0,
            non_leaf_bf: 4,
            non_leaf_prob: 15.0 / 64.0,
            shift_depth: 0.5,
            granularity: 1,
        }
    }
}

/// The reference's sample trees with their published node and leaf counts.
pub const SAMPLES: &[(&str, &str, u64, u64)] = &[
    ("default", "", 1_732, 1_050),
    ("T1", "-t 1 -a 3 -d 10 -b 4 -r 19", 4_130_071, 3_305_118),
    ("T5", "-t 1 -a 0 -d 20 -b 4 -r 34", 4_147_582, 2_181_318),
    ("T2", "-t 1 -a 2 -d 16 -b 6 -r 502", 4_117_769, 2_342_762),
    ("T3", "-t 0 -b 2000 -q 0.124875 -m 8 -r 42", 4_112_897, 3_599_034),
    ("T4", "-t 2 -a 0 -d 16 -b 6 -r 1 -q 0.234375 -m 4 -r 1", 4_132_453, 3_108_986),
    ("T1L", "-t 1 -a 3 -d 13 -b 4 -r 29", 102_181_082, 81_746_377),
    ("T2L", "-t 1 -a 2 -d 23 -b 7 -r 220", 96_793_510, 53_791_152),
    ("T3L", "-t 0 -b 2000 -q 0.200014 -m 5 -r 7", 111_345_631, 89_076_904),
];

/// A bad parameter string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("UTS parameters: {0}")]
pub struct ParamError(String);

impl Params {
    /// Parses the reference's flags (`-t -a -d -b -r -q -m -f -g`), or a sample's name.
    pub fn parse(text: &str) -> Result<Params, ParamError> {
        if let Some(&(_, flags, _, _)) =
            SAMPLES.iter().find(|s| s.0.eq_ignore_ascii_case(text.trim()))
        {
            return Params::parse(flags);
        }
        let words: Vec<&str> = text.split_whitespace().collect();
        let mut params = Params::default();
        for pair in words.chunks(2) {
            let [flag, value] = pair else {
                return Err(ParamError(format!("flag {:?} has no value", pair[0])));
            };
            params.set(flag, value)?;
        }
        params.check()?;
        Ok(params)
    }

    fn set(&mut self, flag: &str, value: &str) -> Result<(), ParamError> {
        let bad = || ParamError(format!("bad value {value:?} for {flag}"));
        let num = || value.parse::<f64>().map_err(|_| bad());
        let int = || value.parse::<i64>().map_err(|_| bad());
        match flag {
            "-t" => self.tree = tree_type(int()?).ok_or_else(bad)?,
            "-a" => self.shape = shape(int()?).ok_or_else(bad)?,
            "-b" => self.b0 = num()?,
            "-d" => self.depth = u32::try_from(int()?).map_err(|_| bad())?,
            "-r" => self.root_id = i32::try_from(int()?).map_err(|_| bad())?,
            "-m" => self.non_leaf_bf = u32::try_from(int()?).map_err(|_| bad())?,
            "-q" => self.non_leaf_prob = num()?,
            "-f" => self.shift_depth = num()?,
            "-g" => self.granularity = u32::try_from(int()?).map_err(|_| bad())?.max(1),
            other => {
                return Err(ParamError(format!(
                    "unknown flag {other:?} (known: -t -a -d -b -r -q -m -f -g)"
                )))
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), ParamError> {
        if !self.b0.is_finite() || self.b0 <= 0.0 {
            return Err(ParamError(format!("-b must be positive, got {}", self.b0)));
        }
        if !(0.0..=1.0).contains(&self.non_leaf_prob) {
            return Err(ParamError(format!("-q must be in [0, 1], got {}", self.non_leaf_prob)));
        }
        let geometric = matches!(self.tree, TreeType::Geometric | TreeType::Hybrid);
        if geometric && self.depth == 0 {
            return Err(ParamError("-d must be at least 1 for geometric trees".into()));
        }
        Ok(())
    }

    /// The published counts when these are a sample tree's parameters.
    pub fn published(&self) -> Option<(&'static str, u64, u64)> {
        SAMPLES.iter().find(|s| Params::parse(s.1).as_ref() == Ok(self)).map(|s| (s.0, s.2, s.3))
    }

    /// The tree's root.
    pub fn root(&self) -> Node {
        let mut seed = [0u8; 20];
        seed[16..].copy_from_slice(&self.root_id.to_be_bytes());
        Node { state: Sha1::digest(seed).into(), height: 0 }
    }

    /// How many children `node` has.
    pub fn children(&self, node: &Node) -> u32 {
        let count = match self.tree {
            TreeType::Binomial if node.height == 0 => self.b0.floor() as u32,
            TreeType::Binomial => self.binomial(node),
            TreeType::Geometric => self.geometric(node),
            TreeType::Hybrid if (node.height as f64) < self.shift_depth * self.depth as f64 => {
                self.geometric(node)
            }
            TreeType::Hybrid => self.binomial(node),
            TreeType::Balanced if node.height < self.depth => self.b0 as u32,
            TreeType::Balanced => 0,
        };
        self.limit(node, count)
    }

    /// Only a binomial root may exceed the reference's 100 children per node.
    fn limit(&self, node: &Node, count: u32) -> u32 {
        let binomial_root = node.height == 0 && self.tree == TreeType::Binomial;
        match self.tree {
            _ if binomial_root => count.min(self.b0.ceil() as u32),
            TreeType::Balanced => count,
            _ => count.min(MAX_CHILDREN),
        }
    }

    fn binomial(&self, node: &Node) -> u32 {
        if node.probability() < self.non_leaf_prob {
            self.non_leaf_bf
        } else {
            0
        }
    }

    fn geometric(&self, node: &Node) -> u32 {
        let b_i = if node.height == 0 { self.b0 } else { self.branching_at(node.height) };
        let p = 1.0 / (1.0 + b_i);
        let u = node.probability();
        let n = ((1.0 - u).ln() / (1.0 - p).ln()).floor();
        if n.is_finite() && n > 0.0 {
            n.min(u32::MAX as f64) as u32
        } else {
            0
        }
    }

    fn branching_at(&self, height: u32) -> f64 {
        let (b0, depth, h) = (self.b0, self.depth as f64, height as f64);
        match self.shape {
            Shape::ExpDec => b0 * h.powf(-b0.ln() / depth.ln()),
            Shape::Cyclic if h > 5.0 * depth => 0.0,
            Shape::Cyclic => b0.powf((2.0 * std::f64::consts::PI * h / depth).sin()),
            Shape::Fixed if height < self.depth => b0,
            Shape::Fixed => 0.0,
            Shape::Linear => b0 * (1.0 - h / depth),
        }
    }

    /// Child `index` of `node` (its state computed `granularity` times, as the reference does).
    pub fn child(&self, node: &Node, index: u32) -> Node {
        let mut state = [0u8; 20];
        for _ in 0..self.granularity {
            let mut hasher = Sha1::new();
            hasher.update(node.state);
            hasher.update(index.to_be_bytes());
            state = hasher.finalize().into();
        }
        Node { state, height: node.height + 1 }
    }
}

const MAX_CHILDREN: u32 = 100;

fn tree_type(t: i64) -> Option<TreeType> {
    [TreeType::Binomial, TreeType::Geometric, TreeType::Hybrid, TreeType::Balanced]
        .get(usize::try_from(t).ok()?)
        .copied()
}

fn shape(a: i64) -> Option<Shape> {
    [Shape::Linear, Shape::ExpDec, Shape::Cyclic, Shape::Fixed]
        .get(usize::try_from(a).ok()?)
        .copied()
}

/// A tree node: generator state and height.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Node {
    pub state: [u8; 20],
    pub height: u32,
}

impl Node {
    /// The node's random number on [0, 1).
    fn probability(&self) -> f64 {
        let bits =
            u32::from_be_bytes([self.state[16], self.state[17], self.state[18], self.state[19]]);
        (bits & 0x7fff_ffff) as f64 / 2_147_483_648.0
    }
}

/// Node, leaf and depth counts of a (part of a) tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    pub nodes: u64,
    pub leaves: u64,
    pub max_depth: u32,
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        self.nodes += other.nodes;
        self.leaves += other.leaves;
        self.max_depth = self.max_depth.max(other.max_depth);
    }
}

/// Visits `node` (counts it) and pushes its children onto `stack`.
pub fn expand(params: &Params, node: &Node, stack: &mut Vec<Node>, counts: &mut Counts) {
    let children = params.children(node);
    counts.nodes += 1;
    counts.max_depth = counts.max_depth.max(node.height);
    if children == 0 {
        counts.leaves += 1;
    }
    stack.extend((0..children).map(|i| params.child(node, i)));
}

/// Counts the whole tree on one thread.
pub fn count_sequential(params: &Params) -> Counts {
    let mut stack = vec![params.root()];
    let mut counts = Counts::default();
    while let Some(node) = stack.pop() {
        expand(params, &node, &mut stack, &mut counts);
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tree_has_the_published_counts() {
        let c = count_sequential(&Params::default());
        assert_eq!((c.nodes, c.leaves), (1_732, 1_050));
    }

    /// Every shape (geometric fixed, linear, cyclic; binomial; hybrid) against its published
    /// sample; the 100 M-node samples are left to `ftkv bench uts --tree T1L`.
    #[test]
    #[cfg_attr(debug_assertions, ignore = "4 M nodes per tree: run with --release")]
    fn small_samples_have_the_published_counts() {
        for (name, _, nodes, leaves) in SAMPLES.iter().filter(|s| s.2 < 10_000_000) {
            let c = count_sequential(&Params::parse(name).unwrap());
            assert_eq!((c.nodes, c.leaves), (*nodes, *leaves), "{name}");
        }
    }

    #[test]
    fn parameter_strings_parse_and_reject_nonsense() {
        let t1 = Params::parse("-t 1 -a 3 -d 10 -b 4 -r 19").unwrap();
        assert_eq!(
            (t1.tree, t1.shape, t1.depth, t1.root_id),
            (TreeType::Geometric, Shape::Fixed, 10, 19)
        );
        assert_eq!(Params::parse("T1"), Ok(t1));
        assert_eq!(t1.published().map(|p| p.0), Some("T1"));
        assert_eq!(Params::parse("").unwrap().published().map(|p| p.1), Some(1_732));
        for bad in ["-t 9", "-x 1", "-b", "-b -1", "-q 2", "-d zero"] {
            assert!(Params::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn nodes_round_trip_through_the_codec() {
        let node = Params::default().child(&Params::default().root(), 3);
        assert_eq!(ftkv::codec::decode::<Node>(&ftkv::codec::encode(&node)), Some(node));
    }
}
