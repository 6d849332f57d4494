/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * attach_space.h - the test programs' way to hand wicd this process's address space: CUDA opens
 * /dev/nvidia-uvm more than once, and only the file of the VA space is accepted.
 */
#ifndef WIC_TESTS_ATTACH_SPACE_H
#define WIC_TESTS_ATTACH_SPACE_H

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <unistd.h>

#include <wic.h>

/* Attaches the first of this process's /dev/nvidia-uvm files that wicd accepts. */
inline int attach_space(wic_client *client, uint32_t *space)
{
	DIR *dir = opendir("/proc/self/fd");
	int rc = WIC_ENOT_FOUND;
	struct dirent *entry;

	if (!dir)
		return WIC_EIO;
	while ((entry = readdir(dir))) {
		char path[300], target[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%s", entry->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n < 0)
			continue;
		target[n] = '\0';
		if (strcmp(target, "/dev/nvidia-uvm"))
			continue;
		rc = wic_attach_space(client, atoi(entry->d_name), space);
		if (rc == WIC_OK)
			break;
	}
	closedir(dir);
	return rc;
}

#endif /* WIC_TESTS_ATTACH_SPACE_H */
