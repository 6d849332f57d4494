// Compiles against an installed wic: a kernel that waits on a push channel.
#include <wic/wic.cuh>

__global__ void first_byte(wic::channel ch, int *out)
{
	const uint8_t *message;
	int rc = wic::recv(ch, 0, 0, threadIdx.x / 32, &message);
	if (threadIdx.x == 0)
		*out = rc == WIC_OK ? message[0] : rc;
}

int main()
{
	wic::host_channel ch;
	return ch.create(wic::transport::push, 1, 64, 1) == cudaSuccess ? 0 : 1;
}
