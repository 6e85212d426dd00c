//! Every ```toml block in README.md and in docs/ is a config a user may
//! copy: each must pass `tend check-config`. A block preceded by
//! `<!-- not a full config -->` is a fragment, and must still be valid TOML.

use std::path::Path;
use std::process::Command;

const TEND: &str = env!("CARGO_BIN_EXE_tend");
const FRAGMENT: &str = "<!-- not a full config -->";

/// (line of the opening fence, whether it is a fragment, the block's text).
fn toml_blocks(markdown: &str) -> Vec<(usize, bool, String)> {
    let mut blocks = Vec::new();
    let mut previous = "";
    let mut lines = markdown.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line.trim() == "```toml" {
            let fragment = previous.trim() == FRAGMENT;
            let body: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| l.trim() != "```")
                .collect();
            blocks.push((n + 1, fragment, body.join("\n") + "\n"));
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    blocks
}

/// README.md and every page of docs/, by their path from the repository.
fn pages() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| format!("docs/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|p| p.ends_with(".md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

#[test]
fn every_toml_block_in_the_readme_and_the_docs_is_a_valid_config() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut full = 0;
    for page in pages() {
        let text = std::fs::read_to_string(root.join(&page)).unwrap();
        full += check_blocks(&page, &text);
    }
    assert!(
        full >= 4,
        "the reference, the README's examples, and more: {full}"
    );
}

/// Checks every toml block of `page`; returns how many are full configs.
fn check_blocks(page: &str, markdown: &str) -> usize {
    let blocks = toml_blocks(markdown);
    let full = blocks.iter().filter(|(_, fragment, _)| !fragment).count();
    let dir = tempfile::tempdir().unwrap();
    for (line, fragment, text) in blocks {
        if fragment {
            if let Err(e) = text.parse::<toml::Table>() {
                panic!("{page} line {line}: not TOML: {e}\n{text}");
            }
            continue;
        }
        let cfg = dir.path().join(format!("line-{line}.toml"));
        std::fs::write(&cfg, &text).unwrap();
        let out = Command::new(TEND)
            .args(["check-config", "--config"])
            .arg(&cfg)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{page} line {line}: tend check-config fails:\n{}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    full
}

#[test]
fn the_readme_links_to_every_page_of_the_docs_and_each_link_leads_somewhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for page in pages().into_iter().skip(1) {
        assert!(
            readme.contains(&format!("]({page})")),
            "README.md links to {page}"
        );
    }
    for page in pages() {
        let text = std::fs::read_to_string(root.join(&page)).unwrap();
        let base = root.join(&page).parent().unwrap().to_path_buf();
        for target in text.split("](").skip(1).filter_map(|t| t.split(')').next()) {
            let file = target.split('#').next().unwrap();
            if file.is_empty() || file.contains("://") {
                continue;
            }
            assert!(
                base.join(file).exists(),
                "{page} links to {target}, which is not there"
            );
        }
    }
}

#[test]
fn fragments_are_told_from_full_configs() {
    let md = "a\n\n```toml\n[service]\n```\n\n<!-- not a full config -->\n\n```toml\nx = 1\n```\n";
    assert_eq!(
        toml_blocks(md),
        [
            (3, false, "[service]\n".to_string()),
            (9, true, "x = 1\n".to_string())
        ]
    );
}
