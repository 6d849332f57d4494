/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The ten applications' description, the one both sides read: the programs take their default
 * sizes and the structure of their messages from here, and the emulator (emu/src/apps.rs)
 * parses this file to run the same programs. What the structure cannot give, the consumer's
 * compute and a host producer's time, the emulator takes from the program's measured nowait
 * run; a test checks that the runs it takes them from had these sizes.
 *
 * One definition per line, "#define APP_NAME value", the value a plain decimal integer, so
 * that the emulator's parser stays trivial.
 */
#ifndef WIC_APPS_DESCRIPTION_H
#define WIC_APPS_DESCRIPTION_H

/* C_SRS: every block's warps each wait for a message of their own samples, per generation. */
#define C_SRS_WARPS 16		/* waiting warps per block */
#define C_SRS_SAMPLES 1024	/* floats per warp message */
#define C_SRS_GENERATIONS 64

/* C_CG: conjugate gradient on an N^3 grid; the host sends every block its part per iteration. */
#define C_CG_N 64
#define C_CG_ITERATIONS 50

/* C_FE: the host assembles E^3 elements into batches for the warps, then runs C_CG's loop. */
#define C_FE_WARPS 4		/* waiting warps per block */
#define C_FE_ELEMENT_BYTES 128	/* struct element */
#define C_FE_ELEMENTS_PER_MESSAGE 32
#define C_FE_E 48
#define C_FE_ITERATIONS 20

/* C_H3D: heat on an N^3 grid, the host's half exchanging a boundary plane in TILES bands. */
#define C_H3D_N 64
#define C_H3D_ITERATIONS 100
#define C_H3D_TILES 8

/* G_STN: a 2D stencil on an N^2 grid split over two GPUs, halos in TILES bands per sweep. */
#define G_STN_N 1024
#define G_STN_ITERATIONS 500
#define G_STN_TILES 8

/* G_C2D: a 2D filter on an N^2 grid split over two GPUs, one edge row a pass. */
#define G_C2D_N 4096
#define G_C2D_ITERATIONS 64

/* G_KMN: k-means, GPU 1 sending a batch's partial sums per cluster (struct partial). */
#define G_KMN_FEATURES 32
#define G_KMN_CLUSTERS 16
#define G_KMN_POINTS 1048576
#define G_KMN_ROUNDS 16
#define G_KMN_BATCH 512

/* G_GEM: C = alpha A B + beta C over two GPUs, one TILE x TILE tile of C a message. */
#define G_GEM_TILE 64
#define G_GEM_N 2048
#define G_GEM_ITERATIONS 8

/* G_BS: a bitonic sort of KEYS keys over two GPUs, merge steps exchanging MESSAGE-key messages. */
#define G_BS_KEYS 16777216
#define G_BS_CHUNKS 16
#define G_BS_MESSAGE 4096

/* G_BFS: breadth-first search; a message is a header (struct header) and up to ENTRIES vertices. */
#define G_BFS_HEADER_WORDS 3
#define G_BFS_VERTICES 4194304
#define G_BFS_DEGREE 8
#define G_BFS_ENTRIES 1021

#endif /* WIC_APPS_DESCRIPTION_H */
