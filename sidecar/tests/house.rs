//! The house keeps its shape: no import circle between the files of either crate, and no file
//! of either crate's `src` longer than a reader holds in mind.
//!
//! A circle is a set of files that reach each other through their imports: none of them can
//! be read, tested or moved without the others, which is how the drain, the checks and the
//! way out to the socket once grew into one knot. Each file is a node; an edge runs from a
//! file to every file one of its paths names (`use` trees, and `crate::`/`super::`/`self::`
//! paths in code), inline `mod` blocks (a file's `mod tests`) belonging to their file. A
//! path that names an item a module re-exports (`pub use`) counts as naming the module that
//! defines it, as a reader following it would arrive there. The files are parsed with `syn`,
//! so a path in a comment or a string is no edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A file of code past this many lines (its in-file tests included) is split by what it
/// holds. `sidecar/tests` is exempt: a test file per feature grows with the feature.
const MAX_LINES: usize = 900;

/// The two crates' sources, relative to the workspace root. `bin/` is a crate of its own that
/// uses the library by name, so it is no node of the library's graph.
const CRATES: [&str; 2] = ["sidecar/src", "extension/src"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// A module path (`["history", "line"]`) for a file under `src`: `lib.rs` is the root,
/// `a/mod.rs` is `a`, `a/b.rs` is `a::b`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        name => parts.push(name.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// One crate read: which file each module lives in, and what each module re-exports.
struct Crate {
    files: BTreeMap<Vec<String>, String>,
    /// (module, name) → the module path the name was re-exported from.
    reexports: BTreeMap<(Vec<String>, String), Vec<String>>,
    /// Every file's parsed paths, resolved to absolute module paths.
    named: BTreeMap<String, Vec<Vec<String>>>,
}

/// Collects the paths one file names, resolved against the module they are written in.
struct Paths<'a> {
    /// The module the visitor is in (the file's, plus inline `mod` blocks).
    at: Vec<String>,
    /// Module paths that exist (files and inline modules), to tell `use child::X` from a crate.
    modules: &'a BTreeSet<Vec<String>>,
    found: Vec<Vec<String>>,
    reexports: Vec<(Vec<String>, String, Vec<String>)>,
}

impl Paths<'_> {
    /// `segments` resolved to an absolute path, or None for another crate's path.
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let (mut base, rest) = match first.as_str() {
            "crate" => (Vec::new(), &segments[1..]),
            "self" => (self.at.clone(), &segments[1..]),
            "super" => {
                let mut base = self.at.clone();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            _ => {
                let mut child = self.at.clone();
                child.push(first.clone());
                if self.modules.contains(&child) {
                    (self.at.clone(), segments)
                } else {
                    return None;
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, public: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, public);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.used(prefix, n.ident.to_string(), None, public),
            syn::UseTree::Rename(r) => self.used(
                prefix,
                r.ident.to_string(),
                Some(r.rename.to_string()),
                public,
            ),
            syn::UseTree::Glob(_) => {
                if let Some(path) = self.resolve(prefix) {
                    self.found.push(path);
                }
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree, public);
                }
            }
        }
    }

    fn used(&mut self, prefix: &[String], name: String, rename: Option<String>, public: bool) {
        let mut segments = prefix.to_vec();
        if name != "self" {
            segments.push(name.clone());
        }
        let Some(path) = self.resolve(&segments) else {
            return;
        };
        if public {
            let as_name = rename.unwrap_or(name);
            self.reexports
                .push((self.at.clone(), as_name, path.clone()));
        }
        self.found.push(path);
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let public = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &item.tree, public);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_some() {
            self.at.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.at.pop();
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 && matches!(segments[0].as_str(), "crate" | "super" | "self") {
            if let Some(resolved) = self.resolve(&segments) {
                self.found.push(resolved);
            }
        }
        syn::visit::visit_path(self, path);
    }
}

/// Inline `mod name { ... }` blocks of a file, as module paths under `at`.
fn inline_modules(items: &[syn::Item], at: &[String], out: &mut BTreeSet<Vec<String>>) {
    for item in items {
        if let syn::Item::Mod(m) = item {
            let mut path = at.to_vec();
            path.push(m.ident.to_string());
            if let Some((_, inner)) = &m.content {
                inline_modules(inner, &path, out);
            }
            out.insert(path);
        }
    }
}

fn read_crate(src: &Path) -> Crate {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    paths.retain(|p| !p.strip_prefix(src).unwrap().starts_with("bin"));
    let mut parsed = Vec::new();
    let mut files = BTreeMap::new();
    let mut modules = BTreeSet::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let module = module_of(src, &path);
        let name = path
            .strip_prefix(workspace())
            .unwrap_or(&path)
            .display()
            .to_string();
        inline_modules(&file.items, &module, &mut modules);
        modules.insert(module.clone());
        files.insert(module.clone(), name.clone());
        parsed.push((module, name, file));
    }
    let mut named = BTreeMap::new();
    let mut reexports = BTreeMap::new();
    for (module, name, file) in &parsed {
        let mut visitor = Paths {
            at: module.clone(),
            modules: &modules,
            found: Vec::new(),
            reexports: Vec::new(),
        };
        visitor.visit_file(file);
        for (at, as_name, from) in visitor.reexports {
            reexports.insert((at, as_name), from);
        }
        named.insert(name.clone(), visitor.found);
    }
    Crate {
        files,
        reexports,
        named,
    }
}

impl Crate {
    /// The file a resolved path leads to: the longest module prefix that is a file, following
    /// re-exports to the module that defines the name.
    fn file_of(&self, path: &[String]) -> Option<&String> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let (module, rest) = (1..=path.len())
                .rev()
                .map(|n| (&path[..n], &path[n..]))
                .chain(std::iter::once((&path[..0], &path[..])))
                .find(|(m, _)| self.files.contains_key(*m))?;
            let reexported = rest
                .first()
                .and_then(|name| self.reexports.get(&(module.to_vec(), name.clone())))
                .filter(|from| from.as_slice() != path.as_slice());
            if let Some(from) = reexported {
                let mut next = from.clone();
                next.extend(rest[1..].iter().cloned());
                path = next;
                continue;
            }
            return self.files.get(module);
        }
        None
    }

    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (file, paths) in &self.named {
            let targets = edges.entry(file.clone()).or_default();
            for path in paths {
                match self.file_of(path) {
                    Some(target) if target != file => {
                        targets.insert(target.clone());
                    }
                    _ => {}
                }
            }
        }
        edges
    }
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[v].min(s.low[w.as_str()]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w.as_str()) {
                let low = s.low[v].min(s.index[w.as_str()]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_import_circle_in_either_crate() {
    let mut found = Vec::new();
    for src in CRATES {
        let krate = read_crate(&workspace().join(src));
        let edges = krate.edges();
        assert!(
            edges.len() > 20 && edges.values().map(BTreeSet::len).sum::<usize>() > 50,
            "{src}: too few files or imports read ({} files); is the path right?",
            edges.len()
        );
        found.extend(circles(&edges));
    }
    assert!(
        found.is_empty(),
        "import circles (each a set of files that import each other): {found:#?}"
    );
}

#[test]
fn no_source_file_over_900_lines() {
    let mut long = Vec::new();
    for src in CRATES {
        let mut paths = Vec::new();
        rust_files(&workspace().join(src), &mut paths);
        for path in paths {
            let lines = std::fs::read_to_string(&path).unwrap().lines().count();
            if lines > MAX_LINES {
                let name = path.strip_prefix(workspace()).unwrap_or(&path);
                long.push(format!("{} ({lines} lines)", name.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines, to split by what they hold: {long:#?}"
    );
}

/// The check itself can fail: a circle made of three files, and a re-export that hides one.
#[test]
fn a_circle_through_a_reexport_is_found() {
    let dir = std::env::temp_dir().join(format!("house-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("wing")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write("lib.rs", "mod a; mod wing;\n");
    write("a.rs", "use crate::wing::Door;\npub struct A;\n");
    write("wing/mod.rs", "mod b;\npub use b::Door;\n");
    write("wing/b.rs", "pub struct Door(crate::a::A);\n");
    let krate = read_crate(&dir);
    let edges = krate.edges();
    let found = circles(&edges);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{edges:#?}");
    assert!(found[0].iter().any(|f| f.ends_with("a.rs")), "{found:?}");
    assert!(
        found[0].iter().any(|f| f.ends_with("wing/b.rs")),
        "{found:?}"
    );
}

/// `lib.rs`'s map names every module of the library: a file added without a place in the
/// map is a room a newcomer cannot find (five were, on 2026-11-28).
#[test]
fn lib_rs_names_every_module_in_its_map() {
    let lib = std::fs::read_to_string(workspace().join("sidecar/src/lib.rs")).unwrap();
    let map = lib
        .split("//! # Files")
        .nth(1)
        .expect("lib.rs has a `# Files` section")
        .split("\n\n")
        .next()
        .unwrap();
    let file = syn::parse_file(&lib).unwrap();
    let mut unnamed = Vec::new();
    for item in &file.items {
        if let syn::Item::Mod(m) = item {
            let name = m.ident.to_string();
            if !map.contains(&format!("`{name}`")) && !map.contains(&format!("`{name}/`")) {
                unnamed.push(name);
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "modules lib.rs's `# Files` does not name: {unnamed:?}"
    );
}
