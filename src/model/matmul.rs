//! candle's matrix product, held on every device to the layouts cuBLAS takes.
//!
//! Why it exists: the path a GPU runs is checked on the CPU (`tests/device_path.rs`), but candle's
//! CPU product accepts any strides of a matrix's rows and columns while its CUDA product hands
//! cuBLAS only matrices whose rows (or, transposed, columns) lie densely: a view that narrows the
//! last dimension (a slice of a joined projection's output, say) multiplies on the CPU and fails on
//! the GPU with `MatMulNonContiguous`. Every product of the device path goes through
//! [`matmul`], which refuses such a layout on the CPU too, so the CPU's tests catch it before a
//! GPU run does. The rules are candle 0.11's (`cuda_backend::gemm_config`); the batch dimensions'
//! rules are the same on both devices and left to candle.

use candle_core::{Result, Tensor};

/// `a · b` (`[..., m, k] · [..., k, n]`), refused when either matrix's layout is one cuBLAS cannot
/// take, on every device.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if let Some(why) = cublas_refusal(a, b) {
        candle_core::bail!(
            "matmul: {why} (shapes {:?} · {:?}, strides {:?} · {:?}); make it contiguous first",
            a.dims(),
            b.dims(),
            a.stride(),
            b.stride()
        );
    }
    a.matmul(b)
}

/// Which operand cuBLAS would refuse, or `None` when both lie as it needs. Shapes that do not make a
/// product are left to candle's own error.
fn cublas_refusal(a: &Tensor, b: &Tensor) -> Option<&'static str> {
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() < 2 || ad.len() != bd.len() {
        return None;
    }
    let r = ad.len();
    let (m, k, n) = (ad[r - 2], ad[r - 1], bd[r - 1]);
    // An empty product is zeros without a kernel, whatever the layouts (as candle does).
    if [m, n, k].contains(&0) || ad[..r - 2].contains(&0) {
        return None;
    }
    let (a_rows, a_cols) = (a.stride()[r - 2], a.stride()[r - 1]);
    let (b_rows, b_cols) = (b.stride()[r - 2], b.stride()[r - 1]);
    // A `rows × cols` matrix is taken as stored (unit column stride, rows `cols` apart) or transposed
    // (unit row stride, columns `rows` apart); a dimension of one element may have any stride.
    let dense = |rows: usize, cols: usize, row_stride: usize, col_stride: usize| {
        let as_stored = (col_stride == 1 || cols == 1) && (row_stride == cols || rows == 1);
        let transposed = (col_stride == rows || cols == 1) && (row_stride == 1 || rows == 1);
        as_stored || transposed
    };
    if !dense(m, k, a_rows, a_cols) {
        return Some("the left matrix's rows and columns are not dense");
    }
    if !dense(k, n, b_rows, b_cols) {
        return Some("the right matrix's rows and columns are not dense");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn ramp(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::arange(0f32, n as f32, &Device::Cpu)
            .unwrap()
            .reshape(shape)
            .unwrap()
    }

    #[test]
    fn dense_and_transposed_operands_multiply_as_candle_does() {
        let a = ramp(&[3, 4, 5]);
        let b = ramp(&[3, 6, 5]);
        // Keys as the attention reads them: a prefix of a longer buffer's rows, transposed.
        let buffer = ramp(&[3, 9, 5]);
        let cases = [
            (a.clone(), b.t().unwrap()),
            (a.clone(), buffer.narrow(1, 0, 6).unwrap().t().unwrap()),
            (
                a.t().unwrap().t().unwrap(),
                b.t().unwrap().contiguous().unwrap(),
            ),
            (a.narrow(1, 1, 1).unwrap(), b.t().unwrap()),
            (
                a.transpose(1, 2)
                    .unwrap()
                    .contiguous()
                    .unwrap()
                    .t()
                    .unwrap(),
                b.t().unwrap(),
            ),
        ];
        for (i, (x, y)) in cases.iter().enumerate() {
            let ours = matmul(x, y).unwrap_or_else(|e| panic!("case {i}: {e}"));
            let theirs = x.matmul(y).unwrap();
            let diff = (ours - theirs).unwrap().abs().unwrap().max_all().unwrap();
            assert_eq!(
                diff.to_dtype(DType::F32)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap(),
                0.0
            );
        }
    }

    #[test]
    fn a_view_narrowing_the_last_dimension_is_refused_on_the_cpu_too() {
        // The first half of a joined `[rows, 2·k]` output: candle's CPU product takes it, cuBLAS
        // does not.
        let joined = ramp(&[4, 10]);
        let left = joined.narrow(1, 0, 5).unwrap();
        let w = ramp(&[5, 3]);
        assert!(
            left.matmul(&w).is_ok(),
            "candle's CPU product takes the view"
        );
        let e = matmul(&left, &w).unwrap_err().to_string();
        assert!(e.contains("left matrix") && e.contains("[10, 1]"), "{e}");
        let e = matmul(&w.t().unwrap(), &left.t().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("right matrix"), "{e}");
        // Every other column: strided both ways.
        let every_other = ramp(&[5, 6])
            .reshape((5, 3, 2))
            .unwrap()
            .narrow(2, 0, 1)
            .unwrap();
        let every_other = every_other.squeeze(2).unwrap();
        assert!(matmul(
            &joined.narrow(1, 0, 5).unwrap().contiguous().unwrap(),
            &every_other
        )
        .is_err());
        assert!(matmul(&left.contiguous().unwrap(), &w).is_ok());
        // An empty product is zeros whatever the layouts, as candle makes it on a GPU too.
        let empty = joined.narrow(1, 0, 5).unwrap().narrow(0, 0, 0).unwrap();
        assert_eq!(matmul(&empty, &w).unwrap().dims(), [0, 3]);
    }
}
