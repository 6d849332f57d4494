/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * cg.cuh - conjugate gradients split between host and GPU, shared by C_CG and C_FE (Mantevo
 * HPCCG's loop with its sparse matrix-vector product on the GPU). Per iteration the host sends
 * the search direction p through a wic channel; every block of one persistent kernel receives
 * its rows of p, the grid synchronizes, and each block computes its rows of q = A p (gathering
 * p at the matrix's columns, anywhere in the vector) and its part of p.q, which it returns
 * through the results direction. The host then updates x, r and p. Also the double-precision
 * CPU reference both applications are checked against.
 */
#ifndef WIC_APPS_CG_CUH
#define WIC_APPS_CG_CUH

#include "stream.cuh"

namespace cg {

/* A sparse matrix in CSR form on the host; the reference computes with its double values. */
struct csr {
	uint32_t rows = 0;
	std::vector<uint32_t> row_ptr, cols;
	std::vector<double> vals;
};

inline void spmv(const csr &a, const double *x, double *y)
{
	for (uint32_t i = 0; i < a.rows; i++) {
		double s = 0;
		for (uint32_t e = a.row_ptr[i]; e < a.row_ptr[i + 1]; e++)
			s += a.vals[e] * x[a.cols[e]];
		y[i] = s;
	}
}

inline double dot(const std::vector<double> &u, const std::vector<double> &v)
{
	double s = 0;
	for (size_t i = 0; i < u.size(); i++)
		s += u[i] * v[i];
	return s;
}

/* The matrix as kernels take it: float values. */
struct csr_view {
	uint32_t rows;
	const uint32_t *row_ptr;
	const uint32_t *cols;
	const float *vals;
};

/* A matrix in device memory: its structure, and values uploaded or assembled there. */
class device_csr {
public:
	explicit device_csr(const csr &a) : rows_(a.rows), nnz_(a.cols.size())
	{
		CHECK(cudaMalloc(&row_ptr_, (rows_ + 1) * sizeof(uint32_t)));
		CHECK(cudaMalloc(&cols_, nnz_ * sizeof(uint32_t)));
		CHECK(cudaMalloc(&vals_, nnz_ * sizeof(float)));
		CHECK(cudaMemcpy(row_ptr_, a.row_ptr.data(), (rows_ + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice));
		CHECK(cudaMemcpy(cols_, a.cols.data(), nnz_ * sizeof(uint32_t), cudaMemcpyHostToDevice));
	}
	device_csr(const device_csr &) = delete;
	device_csr &operator=(const device_csr &) = delete;
	~device_csr()
	{
		CHECK(cudaFree(row_ptr_));
		CHECK(cudaFree(cols_));
		CHECK(cudaFree(vals_));
	}

	void upload_values(const csr &a)
	{
		std::vector<float> v(a.vals.begin(), a.vals.end());
		CHECK(cudaMemcpy(vals_, v.data(), nnz_ * sizeof(float), cudaMemcpyHostToDevice));
	}
	std::vector<float> download_values() const
	{
		std::vector<float> v(nnz_);
		CHECK(cudaMemcpy(v.data(), vals_, nnz_ * sizeof(float), cudaMemcpyDeviceToHost));
		return v;
	}
	float *vals() const { return vals_; }
	csr_view view() const { return csr_view{rows_, row_ptr_, cols_, vals_}; }

private:
	uint32_t rows_;
	size_t nnz_;
	uint32_t *row_ptr_ = nullptr, *cols_ = nullptr;
	float *vals_ = nullptr;
};

/*
 * layout - who owns what: block b owns rows [first(b), first(b + 1)); the message for an
 * iteration is one batch of @blocks messages, message b holding block b's rows of p (zero
 * padded to @chunk floats) for warp 0 of block b. A result slot holds q (@rows floats), then
 * one partial p.q per block; block b's part is its rows and its partial.
 */
struct layout {
	uint32_t rows;
	uint32_t blocks;
	uint32_t chunk;

	__host__ __device__ uint32_t first(uint32_t b) const { return (uint32_t)((uint64_t)rows * b / blocks); }
	uint32_t message_bytes() const { return chunk * sizeof(float); }
	uint64_t back_bytes() const { return ((uint64_t)rows + blocks) * sizeof(float); }
	/* The forward channel and results of @iterations iterations. */
	app::forward_spec forward(uint32_t iterations) const { return {1, iterations, message_bytes(), blocks}; }
	app::back_spec back(uint32_t iterations) const { return {iterations, back_bytes(), blocks, 1}; }
};

inline layout make_layout(uint32_t rows, uint32_t blocks)
{
	const uint32_t most = (rows + blocks - 1) / blocks;
	return layout{rows, blocks, (most + 31) / 32 * 32};
}

/* The sum of every thread's @v, in thread 0; every thread of the block calls it. */
__device__ inline float block_sum(float v)
{
	__shared__ float partial[32];
	const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;

	for (int d = 16; d; d /= 2)
		v += __shfl_down_sync(0xffffffff, v, d);
	__syncthreads(); /* the previous call's readers are done */
	if (lane == 0)
		partial[warp] = v;
	__syncthreads();
	v = 0.0f;
	if (warp == 0) {
		v = lane < blockDim.x / 32 ? partial[lane] : 0.0f;
		for (int d = 16; d; d /= 2)
			v += __shfl_down_sync(0xffffffff, v, d);
	}
	return v;
}

/*
 * take_direction() - iteration @k's first step: block b receives its rows of the direction and
 * copies them into p's half k % 2, where every block gathers from once all have. Every thread
 * of the block calls it; a failed receive is counted in *@errors and the block goes on.
 */
__device__ inline void take_direction(const app::forward &fwd, const layout &l, float *p, uint32_t k, int *errors)
{
	__shared__ const float *message;
	const uint32_t b = blockIdx.x, lo = l.first(b), hi = l.first(b + 1);
	float *pk = p + (size_t)(k % 2) * l.rows;

	if (threadIdx.x < 32) {
		const uint8_t *m;
		int status = wic::recv(fwd.ch, fwd.place.slot(0, k), fwd.place.generation(k), b, &m);
		if (threadIdx.x == 0) {
			if (status != WIC_OK)
				atomicAdd(errors, 1);
			message = reinterpret_cast<const float *>(m);
		}
	}
	__syncthreads();
	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
		pk[i] = message[i - lo];
}

/*
 * multiply() - iteration @k's second step, once every block took its rows: block b's rows of
 * q = A p and its part of p.q, posted as the result of @k. Every thread of the block calls it.
 */
__device__ inline void multiply(const wic::result_view &back, const layout &l, csr_view a, const float *p, uint32_t k)
{
	const uint32_t b = blockIdx.x, lo = l.first(b), hi = l.first(b + 1);
	const float *pk = p + (size_t)(k % 2) * l.rows;
	float *q = reinterpret_cast<float *>(back.slot(k));
	float pq = 0.0f;

	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
		float s = 0.0f;
		for (uint32_t e = a.row_ptr[i]; e < a.row_ptr[i + 1]; e++)
			s = fmaf(a.vals[e], pk[a.cols[e]], s);
		q[i] = s;
		pq = fmaf(pk[i], s, pq);
	}
	pq = block_sum(pq);
	if (threadIdx.x == 0)
		q[l.rows + b] = pq;
	wic::post_result(back, k, b);
}

/*
 * launch mode: iteration @k's two steps as kernels of l.blocks blocks, one after the other on a
 * stream (what iterate()'s grid barrier does between them); the second reports the direction
 * consumed, every block having taken its rows.
 */
__global__ void direction_step(app::forward fwd, layout l, float *p, uint32_t k, int *errors)
{
	take_direction(fwd, l, p, k, errors);
}

__global__ void multiply_step(app::forward fwd, wic::result_view back, layout l, csr_view a, const float *p,
			      uint32_t k)
{
	if (blockIdx.x == 0 && threadIdx.x == 0)
		wic::consumed(fwd.ch, fwd.place.slot(0, k), fwd.place.generation(k));
	multiply(back, l, a, p, k);
}

/*
 * iterate() - the kernel's side of @iterations iterations; every thread of a cooperative launch
 * of l.blocks blocks calls it.
 * @fwd: the directions, one generation per iteration (layout::forward)
 * @back: the results (layout::back)
 * @p: device memory for 2 * l.rows floats; iteration k keeps p in half k % 2, so a block that
 *	stores the next p never overwrites the one a slower block still gathers from
 * @grid: the kernel's barrier
 * @errors: incremented per failed receive (the block goes on, so no grid barrier waits forever)
 */
__device__ inline void iterate(const app::forward &fwd, const wic::result_view &back, const layout &l, csr_view a,
			       float *p, uint32_t iterations, app::grid_barrier &grid, int *errors)
{
	for (uint32_t k = 0; k < iterations; k++) {
		take_direction(fwd, l, p, k, errors);
		grid.sync(); /* all of p is in: every block is done with the message */
		if (blockIdx.x == 0 && threadIdx.x == 0)
			wic::consumed(fwd.ch, fwd.place.slot(0, k), fwd.place.generation(k));
		multiply(back, l, a, p, k);
	}
}

/*
 * solver - the host's side: x, r and p in double. It sends p / |r|, which keeps the kernel's
 * float products far from underflow however small r gets, and keeps p as rounded for the
 * message, so that x and r move along the direction the kernel multiplied.
 */
class solver {
public:
	/* Starts from x = 0. */
	void begin(const std::vector<double> &b)
	{
		x_.assign(b.size(), 0.0);
		r_ = b;
		p_ = b;
		rr_ = dot(r_, r_);
	}

	/* Writes an iteration's batch (layout). */
	void message(const layout &l, float *m)
	{
		scale_ = rr_ > 0 ? std::sqrt(rr_) : 1.0;
		for (uint32_t b = 0; b < l.blocks; b++) {
			const uint32_t lo = l.first(b), hi = l.first(b + 1);
			float *out = m + (size_t)b * l.chunk;
			for (uint32_t i = lo; i < hi; i++) {
				out[i - lo] = (float)(p_[i] / scale_);
				p_[i] = out[i - lo] * scale_;
			}
			std::fill(out + (hi - lo), out + l.chunk, 0.0f);
		}
	}

	/* Takes the kernel's q = A p / |r| and partial dots; updates x, r and p. */
	void absorb(const layout &l, const float *back)
	{
		double pq = 0, rr = 0;
		for (uint32_t b = 0; b < l.blocks; b++)
			pq += back[l.rows + b];
		const double alpha = rr_ / (pq * scale_ * scale_);
		for (uint32_t i = 0; i < l.rows; i++) {
			x_[i] += alpha * p_[i];
			r_[i] -= alpha * scale_ * back[i];
			rr += r_[i] * r_[i];
		}
		const double beta = rr / rr_;
		for (uint32_t i = 0; i < l.rows; i++)
			p_[i] = r_[i] + beta * p_[i];
		rr_ = rr;
	}

	const std::vector<double> &x() const { return x_; }

private:
	std::vector<double> x_, r_, p_;
	double rr_ = 0, scale_ = 1;
};

/* The host's side of @iterations iterations through forward channel @c of @io (app::host_io). */
template <typename IO>
void host_iterations(IO &io, uint32_t c, const layout &l, solver &s, const std::vector<double> &b,
			    uint32_t iterations)
{
	s.begin(b);
	for (uint32_t k = 0; k < iterations; k++) {
		io.send(c, 0, k, [&](uint8_t *buf) { s.message(l, reinterpret_cast<float *>(buf)); });
		const uint8_t *back = nullptr;
		for (uint32_t part = 0; part < l.blocks; part++)
			back = io.result(k, part);
		s.absorb(l, reinterpret_cast<const float *>(back));
	}
}

/* The reference: @iterations iterations of the same CG from x = 0, all in double. */
inline std::vector<double> reference(const csr &a, const std::vector<double> &b, uint32_t iterations)
{
	std::vector<double> x(a.rows, 0.0), r = b, p = b, q(a.rows);
	double rr = dot(r, r);

	for (uint32_t k = 0; k < iterations && rr > 0; k++) {
		spmv(a, p.data(), q.data());
		const double alpha = rr / dot(p, q);
		double next = 0;
		for (uint32_t i = 0; i < a.rows; i++) {
			x[i] += alpha * p[i];
			r[i] -= alpha * q[i];
			next += r[i] * r[i];
		}
		for (uint32_t i = 0; i < a.rows; i++)
			p[i] = r[i] + next / rr * p[i];
		rr = next;
	}
	return x;
}

/* |b - A x| / |b| in double. */
inline double residual(const csr &a, const std::vector<double> &b, const std::vector<double> &x)
{
	std::vector<double> ax(a.rows);
	spmv(a, x.data(), ax.data());
	for (uint32_t i = 0; i < a.rows; i++)
		ax[i] = b[i] - ax[i];
	return std::sqrt(dot(ax, ax) / dot(b, b));
}

} /* namespace cg */

#endif /* WIC_APPS_CG_CUH */
