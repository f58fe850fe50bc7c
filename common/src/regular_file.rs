//! Reading a file a user names (a module, a bootstrap, a scenario, a pull secret, the cache
//! index) whole. Only a regular file is read, and only up to a limit checked before any
//! allocation: a path naming `/dev/zero`, a FIFO with no writer or a directory gets an error
//! naming what it is, instead of an endless read, a hang or an allocation of its size.

use std::io::Read;
use std::path::Path;

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("no such file")]
    Missing,
    #[error("not a regular file ({0}); give the path of a file")]
    NotRegular(&'static str),
    #[error("a symbolic link, which is not followed here")]
    Link,
    #[error("larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("not UTF-8 text (invalid byte at offset {offset})")]
    NotText { offset: usize },
    #[error("{0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::NotFound => Self::Missing,
            std::io::ErrorKind::IsADirectory => Self::NotRegular("a directory"),
            _ => Self::Io(e),
        }
    }
}

/// What a file that is not regular is, in words.
pub fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// Opens `path` for reading if it is a regular file. The open does not block (a FIFO with no
/// writer would never open) and the type is checked on the opened file, so a path swapped
/// after a check cannot slip through.
pub fn open(path: &Path) -> Result<std::fs::File, ReadError> {
    open_with(path, false)
}

/// [`open`], refusing a path whose last component is a symbolic link (`O_NOFOLLOW`): what is
/// opened is the file named, not one a link swapped in between a check and the open.
pub fn open_no_follow(path: &Path) -> Result<std::fs::File, ReadError> {
    open_with(path, true)
}

fn open_with(path: &Path, no_follow: bool) -> Result<std::fs::File, ReadError> {
    let mut options = std::fs::File::options();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let follow = if no_follow { libc::O_NOFOLLOW } else { 0 };
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | follow);
    }
    let file = options.open(path).map_err(|e| {
        let meta = if no_follow {
            std::fs::symlink_metadata(path)
        } else {
            std::fs::metadata(path)
        };
        // A socket cannot be opened at all: name it rather than the errno.
        match meta {
            Ok(meta) if meta.file_type().is_symlink() => ReadError::Link,
            Ok(meta) if !meta.is_file() => ReadError::NotRegular(kind_of(&meta)),
            _ => ReadError::from(e),
        }
    })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(kind_of(&meta)));
    }
    Ok(file)
}

/// The whole content of the regular file at `path`, if it has at most `limit` bytes.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    read_open(open(path)?, limit)
}

/// [`read`] through [`open_no_follow`].
pub fn read_no_follow(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    read_open(open_no_follow(path)?, limit)
}

fn read_open(file: std::fs::File, limit: u64) -> Result<Vec<u8>, ReadError> {
    let size = file.metadata()?.len();
    if size > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // The file may grow between the stat and the read: never past the limit.
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(bytes)
}

/// [`read`], as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> Result<String, ReadError> {
    String::from_utf8(read(path, limit)?).map_err(|e| ReadError::NotText {
        offset: e.utf8_error().valid_up_to(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_regular_file_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(read(&p, 5).unwrap(), b"12345");
        assert!(matches!(read(&p, 4), Err(ReadError::TooLarge { limit: 4 })));
        assert!(matches!(
            read(&dir.path().join("none"), 5),
            Err(ReadError::Missing)
        ));
    }

    #[test]
    fn refuses_what_is_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = read(dir.path(), 1 << 20).unwrap_err().to_string();
        assert!(e.contains("not a regular file (a directory)"), "{e}");
        let e = read(Path::new("/dev/zero"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a character device"), "{e}");
    }

    #[test]
    fn no_follow_refuses_a_link_and_reads_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert_eq!(read_no_follow(&p, 5).unwrap(), b"12345");
        assert!(matches!(read_no_follow(&link, 5), Err(ReadError::Link)));
        assert_eq!(read(&link, 5).unwrap(), b"12345");
    }

    #[test]
    fn text_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, [b'a', 0xff]).unwrap();
        assert!(matches!(
            read_text(&p, 10),
            Err(ReadError::NotText { offset: 1 })
        ));
    }
}
