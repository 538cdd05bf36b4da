/* How much device memory an array takes, from its descriptor (CUDA and HIP share the formats
 * and the flags): the charge made when it is created and credited when it is destroyed. */
#include "backend.h"

#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04

/* Bytes per element of a CUarray_format (hipArray_Format has the same values) with `channels`
 * channels; a format this library does not know counts 16 bytes a channel (the widest there
 * is), so it is never under-charged. */
uint64_t hcs_array_element(int format, unsigned int channels)
{
	uint64_t per_channel;
	switch (format) {
	case 0x01: case 0x08: case 0xc0: case 0xc1: case 0xc2: case 0xc6: case 0xc7: case 0xc8:
		per_channel = 1; /* 8-bit integers, 8-bit normalised */
		break;
	case 0x02: case 0x09: case 0x10: case 0xc3: case 0xc4: case 0xc5: case 0xc9: case 0xca:
	case 0xcb:
		per_channel = 2; /* 16-bit integers, half, 16-bit normalised */
		break;
	case 0x03: case 0x0a: case 0x20:
		per_channel = 4; /* 32-bit integers, float */
		break;
	default:
		/* Block-compressed and video formats are at most 8 bytes a pixel; count them
		 * generously, as any format added later. */
		per_channel = 16;
		break;
	}
	return per_channel * (channels ? channels : 1);
}

static uint64_t at_least_one(size_t n)
{
	return n ? n : 1;
}

/* The storage of a Width x Height x Depth array with `levels` mipmap levels (1 for a plain
 * array), rows padded to 512 bytes as the driver pitches them. Sparse and deferred-mapping
 * arrays have no storage of their own: the VMM handles mapped into them are charged. */
uint64_t hcs_array_bytes(size_t width, size_t height, size_t depth, uint64_t element,
			 unsigned int flags, unsigned int levels)
{
	if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))
		return 0;
	uint64_t total = 0;
	bool layers = flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP);
	for (unsigned int level = 0; level < (levels ? levels : 1) && level < 64; level++) {
		uint64_t w = at_least_one(width >> level), h = at_least_one(height >> level);
		uint64_t d = layers ? at_least_one(depth) : at_least_one(depth >> level);
		unsigned __int128 row = ((unsigned __int128)w * element + 511) / 512 * 512;
		unsigned __int128 bytes = row * h * d;
		if (bytes > UINT64_MAX - total)
			return UINT64_MAX;
		total += (uint64_t)bytes;
	}
	return total;
}

