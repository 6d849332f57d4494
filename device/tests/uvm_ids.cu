/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * uvm_ids - nvidia-uvm's id of each CUDA device, as wic::uvm_gpu_id() (libwic's
 * wic_uvm_gpu_id()) translates it, beside nvidia-uvm's own listing (/proc/driver/nvidia-uvm/gpus)
 * that the translation reads. Runs on the stock driver: the ids are nvidia-uvm's, not wic's.
 *
 * Usage: uvm_ids   (CUDA_VISIBLE_DEVICES picks the devices)
 * Prints one line per device, "DEVICE n UUID u UVM_ID id", the listing, and exits 0 when every
 * device was translated.
 */
#include <cstdio>
#include <dirent.h>
#include <string>
#include <unistd.h>

#include <wic/wic.cuh>

namespace {

void list(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		perror(dir);
		return;
	}
	while (const dirent *e = readdir(d)) {
		if (e->d_name[0] == '.')
			continue;
		std::string path = std::string(dir) + "/" + e->d_name;
		char target[256];
		ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
		if (n < 0)
			printf("LIST %s\n", e->d_name);
		else
			printf("LIST %s -> %.*s\n", e->d_name, (int)n, target);
	}
	closedir(d);
}

} /* namespace */

int main()
{
	int devices = 0;
	cudaError_t err = cudaGetDeviceCount(&devices);
	if (err != cudaSuccess) {
		fprintf(stderr, "uvm_ids: cudaGetDeviceCount: %s\n", cudaGetErrorString(err));
		return 1;
	}
	int failed = 0;
	for (int device = 0; device < devices; device++) {
		cudaDeviceProp prop;
		if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
			return 1;
		char uuid[37];
		const unsigned char *b = reinterpret_cast<const unsigned char *>(prop.uuid.bytes);
		snprintf(uuid, sizeof(uuid), "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
			 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
		uint32_t id = 0;
		int rc = wic::uvm_gpu_id(device, &id);
		if (rc == WIC_OK) {
			printf("DEVICE %d UUID GPU-%s UVM_ID %u\n", device, uuid, id);
		} else {
			printf("DEVICE %d UUID GPU-%s UVM_ID none (%s)\n", device, uuid, wic_strerror(rc));
			failed = 1;
		}
	}
	list("/proc/driver/nvidia-uvm/gpus");
	return failed;
}
