// Whether this test binary is built with AddressSanitizer. A command that caps
// virtual memory (`ulimit -v`) cannot start under it (ASan reserves terabytes of
// shadow address space), so such checks are skipped in the sanitizer build
// (scripts/sanitize.sh), saying so.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif
