//! Where to look for NSDs whose device path changed: the block devices of this machine and
//! an administrator's search list (`nsddevices`, as GPFS's user exit of that name lists
//! devices to consider). The caller reads each candidate's descriptor and matches NSD ids;
//! this module only names the candidates.

use std::io;
use std::path::{Path, PathBuf};

/// Every block device of this machine as `/dev/NAME`, partitions and loop devices
/// included, from `/sys/class/block`. Devices with no capacity (an unattached loop device,
/// an empty drive bay) are left out: they cannot hold a descriptor.
pub fn local_block_devices() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/class/block") else {
        return Vec::new();
    };
    let mut devices: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("size"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .is_some_and(|sectors| sectors > 0)
        })
        .map(|e| Path::new("/dev").join(e.file_name()))
        .filter(|p| p.exists())
        .collect();
    devices.sort();
    devices
}

/// The paths an `nsddevices` file lists: one path per line, `#` starts a comment. A line
/// naming a directory means every regular file in it; `*` and `?` in the last component
/// match file names, so `/srv/drives/*.img` finds file-backed drives wherever they are
/// attached. A missing file is an empty list.
///
/// # Errors
/// The file exists but cannot be read, or a line names a relative path.
pub fn search_list(file: &Path) -> io::Result<Vec<PathBuf>> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", file.display()))),
    };
    let mut paths = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let entry = line.split('#').next().unwrap_or("").trim();
        if entry.is_empty() {
            continue;
        }
        let path = Path::new(entry);
        if !path.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}:{}: {entry}: not an absolute path; list one absolute path or glob \
                     (`/dir/*.img`) per line",
                    file.display(),
                    n + 1
                ),
            ));
        }
        paths.extend(expand(path));
    }
    Ok(paths)
}

fn expand(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let (dir, pattern) = if name.contains(['*', '?']) {
        (path.parent().unwrap_or(Path::new("/")), name)
    } else if path.is_dir() {
        (path, "*")
    } else {
        return vec![path.to_path_buf()];
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| glob_match(pattern, n))
        })
        .map(|e| e.path())
        .filter(|p| p.is_file() || is_block_device(p))
        .collect();
    found.sort();
    found
}

fn is_block_device(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

/// Shell-style matching of one file name: `*` any run of characters, `?` one character.
fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_file_names() {
        assert!(glob_match("*.img", "d1.img"));
        assert!(glob_match("d?.img", "d1.img"));
        assert!(!glob_match("d?.img", "d10.img"));
        assert!(glob_match("*", "anything"));
        assert!(!glob_match("*.img", "d1.raw"));
    }

    #[test]
    fn search_list_expands_globs_and_directories_and_refuses_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a.img", "b.img", "c.raw"] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("d"), b"x").unwrap();
        let list = dir.path().join("nsddevices");
        std::fs::write(
            &list,
            format!(
                "# drives\n{}/*.img\n\n{}  # a directory\n",
                dir.path().display(),
                sub.display()
            ),
        )
        .unwrap();
        let found = search_list(&list).unwrap();
        let names: Vec<String> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.img", "b.img", "d"]);
        assert!(search_list(&dir.path().join("none")).unwrap().is_empty());
        std::fs::write(&list, "drives/*.img\n").unwrap();
        let e = search_list(&list).unwrap_err();
        assert!(e.to_string().contains("nsddevices:1"), "{e}");
        assert!(e.to_string().contains("absolute"), "{e}");
    }
}
