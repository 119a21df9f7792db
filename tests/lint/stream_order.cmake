# Every device operation of the library goes on a stream it owns: the backend's streams are non-blocking, so they
# do not wait for the legacy default stream, and work put there races with them. (The RoPE table was once copied with
# a plain cudaMemcpy, and a fresh engine's first RoPE kernel could read it before it landed: docs/benchmarks.md,
# "Device session of 2026-12-03 18:40-19:25".) This scans ROOT's src/ and include/ (or DIRS, a ;-list) for
#   - the synchronous copy and set calls (cudaMemcpy(, cudaMemset(, cudaMemcpy2D(, ...), which use the legacy stream;
#   - kernel launches <<<...>>> with fewer than four launch arguments (no stream);
#   - cudaStreamLegacy and the null stream passed as 0 / nullptr to an ...Async call.
# A line may be kept by a comment "legacy stream: <why it is safe>" on it or on the line above.
#   cmake -DROOT=<repository> -P tests/lint/stream_order.cmake
if(NOT DIRS)
  set(DIRS "${ROOT}/src;${ROOT}/include")
endif()
set(files)
foreach(dir IN LISTS DIRS)
  file(GLOB_RECURSE found "${dir}/*.cu" "${dir}/*.cuh" "${dir}/*.cpp" "${dir}/*.hpp" "${dir}/*.h")
  list(APPEND files ${found})
endforeach()
list(LENGTH files nfiles)
if(nfiles EQUAL 0)
  message(FATAL_ERROR "stream_order: no sources under ${DIRS}")
endif()
set(violations 0)
foreach(f IN LISTS files)
  file(STRINGS "${f}" lines)
  set(prev "")
  set(n 0)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    set(bad "")
    # Comments do not count: drop a trailing // comment (not inside a string; the library has none with "//").
    string(REGEX REPLACE "//.*$" "" code "${line}")
    if(code MATCHES "cuda(Memcpy|Memset|Memcpy2D|Memcpy3D|MemcpyToSymbol|MemcpyFromSymbol|MemcpyPeer|Memset2D|Memset3D)[ ]*\\(")
      set(bad "synchronous cuda${CMAKE_MATCH_1} (legacy default stream)")
    elseif(code MATCHES "cudaStreamLegacy")
      set(bad "cudaStreamLegacy")
    elseif(code MATCHES "<<<(.*)>>>")
      set(cfg "${CMAKE_MATCH_1}")
      # Top-level commas only: drop parenthesised groups (twice, for one level of nesting).
      string(REGEX REPLACE "\\([^()]*\\)" "_" cfg "${cfg}")
      string(REGEX REPLACE "\\([^()]*\\)" "_" cfg "${cfg}")
      string(REGEX MATCHALL "," commas "${cfg}")
      list(LENGTH commas ncommas)
      if(ncommas LESS 3)
        set(bad "kernel launch without a stream")
      endif()
    elseif(code MATCHES "cuda[A-Za-z0-9]*Async[ ]*\\(.*,[ ]*(0|nullptr|NULL)[ ]*\\)[ ]*\\)?[ ]*;")
      set(bad "an Async call on the null stream")
    endif()
    if(bad AND NOT line MATCHES "legacy stream:" AND NOT prev MATCHES "legacy stream:")
      message(SEND_ERROR "${f}:${n}: ${bad}: ${line}")
      math(EXPR violations "${violations} + 1")
    endif()
    set(prev "${line}")
  endforeach()
endforeach()
if(violations GREATER 0)
  message(FATAL_ERROR "stream_order: ${violations} device operation(s) outside the library's streams")
endif()
message(STATUS "stream_order: ${nfiles} files, every device operation on an owned stream")
