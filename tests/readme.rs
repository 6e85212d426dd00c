//! Every ```toml block in README.md is a config a user may copy: each must
//! pass `tend check-config`. A block preceded by `<!-- not a full config -->`
//! is a fragment, and must still be valid TOML.

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

#[test]
fn every_toml_block_in_the_readme_is_a_valid_config() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let blocks = toml_blocks(&readme);
    let full = blocks.iter().filter(|(_, fragment, _)| !fragment).count();
    assert!(
        full >= 2,
        "the reference and the Kubernetes example: {blocks:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    for (line, fragment, text) in blocks {
        if fragment {
            if let Err(e) = text.parse::<toml::Table>() {
                panic!("README.md line {line}: not TOML: {e}\n{text}");
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
            "README.md line {line}: tend check-config fails:\n{}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
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
