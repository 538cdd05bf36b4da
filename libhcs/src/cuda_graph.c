/* CUDA graph memory nodes. An allocation node gets its address when it is added and its memory
 * whenever the graph runs, so it is charged from the moment it is added (on the device its pool
 * location names; host locations are not charged). It is credited when the address is freed
 * outside any graph (cuMemFree, cuMemFreeAsync: it is tracked like any device pointer), or,
 * when a free node frees it inside a graph, once the graph holding that free node is destroyed
 * (until then every launch may allocate it again). */
#include <pthread.h>
#include <string.h>

#include "cuda.h"

HCS_CUDA_BACKEND(HCS_SYMBOLS_cuda_graph, HCS_CUDA_HELPERS)
HCS_CUDA_SWAP(hcs_cuda_graph_swap, HCS_SYMBOLS_cuda_graph)

/* Allocations a graph frees, credited when that graph is destroyed. When the table is full an
 * allocation stays charged (a miss logged once): never under-counted. */
#define GRAPH_FREES 1024
static struct { CUgraph graph; CUdeviceptr dptr; int device; uint64_t size; } frees[GRAPH_FREES];
static pthread_mutex_t frees_lock = PTHREAD_MUTEX_INITIALIZER;

void hcs_graph_fork(enum hcs_fork_phase phase)
{
	if (phase == HCS_FORK_PREPARE) {
		pthread_mutex_lock(&frees_lock);
	} else if (phase == HCS_FORK_PARENT) {
		pthread_mutex_unlock(&frees_lock);
	} else {
		memset(frees, 0, sizeof(frees)); /* the parent's graphs */
		pthread_mutex_init(&frees_lock, NULL);
	}
}

static void freed_by_graph(CUgraph graph, CUdeviceptr dptr)
{
	int device;
	uint64_t size;
	if (!hcs_untrack(dptr, HCS_KIND_PTR, &device, &size))
		return;
	pthread_mutex_lock(&frees_lock);
	int slot = -1;
	for (int i = 0; i < GRAPH_FREES && slot < 0; i++)
		if (!frees[i].graph)
			slot = i;
	if (slot >= 0) {
		frees[slot].graph = graph;
		frees[slot].dptr = dptr;
		frees[slot].device = device;
		frees[slot].size = size;
	}
	pthread_mutex_unlock(&frees_lock);
	if (slot < 0) {
		hcs_track(dptr, HCS_KIND_PTR, device, size);
		hcs_log("more than %d graph-freed allocations; the rest stay charged", GRAPH_FREES);
	}
}

static void graph_destroyed(CUgraph graph)
{
	pthread_mutex_lock(&frees_lock);
	for (int i = 0; i < GRAPH_FREES; i++) {
		if (frees[i].graph != graph)
			continue;
		int device = frees[i].device;
		uint64_t size = frees[i].size;
		frees[i].graph = NULL;
		pthread_mutex_unlock(&frees_lock);
		hcs_unreserve(device, size);
		pthread_mutex_lock(&frees_lock);
	}
	pthread_mutex_unlock(&frees_lock);
}

#define ALLOC_NODE(name, args, params)                                                       \
	int device = HCS_CUDA_LOCATION_DEVICE(&(params)->poolProps.location);                \
	if (device < 0)                                                                      \
		return real_##name args;                                                     \
	HCS_ALLOC_ON(cuda, name, args, HCS_KIND_PTR, (params)->dptr, (params)->bytesize, device)

CUresult hcs_cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
				    size_t count, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
	cuda_ready();
	if (!real_cuGraphAddMemAllocNode)
		return CUDA_ERROR_NOT_FOUND;
	if (!hcs_enforcing() || !params)
		return real_cuGraphAddMemAllocNode(node, graph, deps, count, params);
	ALLOC_NODE(cuGraphAddMemAllocNode, (node, graph, deps, count, params), params);
}

CUresult hcs_cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
				   size_t count, CUdeviceptr dptr)
{
	cuda_ready();
	if (!real_cuGraphAddMemFreeNode)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuGraphAddMemFreeNode(node, graph, deps, count, dptr);
	if (rc == CUDA_SUCCESS && hcs_enforcing())
		freed_by_graph(graph, dptr);
	return rc;
}

/* The generic node call: memory allocation and free nodes as above, the rest untouched. */
#define ADD_NODE(name, args)                                                                 \
	cuda_ready();                                                                        \
	if (!real_##name)                                                                    \
		return CUDA_ERROR_NOT_FOUND;                                                 \
	if (!hcs_enforcing() || !params)                                                     \
		return real_##name args;                                                     \
	if (params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {                                  \
		ALLOC_NODE(name, args, &params->alloc);                                      \
	}                                                                                    \
	CUresult rc = real_##name args;                                                      \
	if (rc == CUDA_SUCCESS && params->type == CU_GRAPH_NODE_TYPE_MEM_FREE)               \
		freed_by_graph(graph, params->free.dptr);                                    \
	return rc

CUresult hcs_cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
			    size_t count, CUgraphNodeParams *params)
{
	ADD_NODE(cuGraphAddNode, (node, graph, deps, count, params));
}

CUresult hcs_cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
			       const CUgraphEdgeData *edges, size_t count, CUgraphNodeParams *params)
{
	ADD_NODE(cuGraphAddNode_v2, (node, graph, deps, edges, count, params));
}

CUresult hcs_cuGraphDestroy(CUgraph graph)
{
	cuda_ready();
	if (!real_cuGraphDestroy)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real_cuGraphDestroy(graph);
	if (rc == CUDA_SUCCESS && hcs_cfg.enforcing)
		graph_destroyed(graph);
	return rc;
}
