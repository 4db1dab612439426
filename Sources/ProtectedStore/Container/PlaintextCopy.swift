import CSupport
import Foundation
import ProtectedStoreCore
import SystemPackage

/// Copies a local file, or a pipe, into an encrypted file in bounded memory: one chunk at a time, and for a regular
/// file only its data (SEEK_DATA/SEEK_HOLE), so a sparse source stays sparse at rest and costs nothing for its holes.
struct PlaintextCopy {
    /// Bytes read per step: big enough for the parallel encryption, small enough for constant memory.
    static let chunkBytes = 1 << 20

    let source: FileDescriptor
    /// Names the source in errors.
    let sourcePath: String

    /// Copies everything the source holds to `file` from offset 0; returns the bytes copied (holes included).
    /// `progress` gets the bytes done so far and the source's size when known.
    func copy(to file: EncryptedFile, progress: ((UInt64, UInt64) -> Void)? = nil) throws -> UInt64 {
        var buffer = [UInt8](repeating: 0, count: Self.chunkBytes)
        defer { zeroize(&buffer) }
        var info = stat()
        let isRegular = fstat(source.rawValue, &info) == 0 && info.st_mode & S_IFMT == S_IFREG
        // A file that reports no size may still have content (procfs, sysfs), and a file system may not answer
        // SEEK_DATA: those are read to their end as a pipe is.
        let seeksData = isRegular && info.st_size > 0 && (ps_seek_data(source.rawValue, 0) >= 0 || Foundation.errno == ENXIO)
        guard seeksData else {
            // A pipe, a terminal, or one of the above: read to its end.
            var offset: Int64 = 0
            while true {
                let count = try buffer.withUnsafeMutableBytes { buffer in
                    try FileSystem.mappingErrno(path: sourcePath, doing: "read") { try source.read(into: buffer, retryOnInterrupt: true) }
                }
                if count == 0 { return UInt64(offset) }
                try buffer.withUnsafeBytes { try file.write(from: UnsafeRawBufferPointer(rebasing: $0[0..<count]), at: offset) }
                offset += Int64(count)
                progress?(UInt64(offset), UInt64(offset))
            }
        }
        let size = Int64(info.st_size)
        var offset: Int64 = 0
        var end: Int64 = 0
        while true {
            // Where the next data starts; past the end (ENXIO) only holes are left. A file system without SEEK_DATA
            // reports the whole file as data, which is copied as it reads.
            let dataStart = Int64(ps_seek_data(source.rawValue, offset))
            guard dataStart >= 0 else {
                guard Foundation.errno == ENXIO else { throw ProtectedStoreError.io(Errno(rawValue: Foundation.errno), path: sourcePath, doing: "find the data") }
                break
            }
            let holeStart = Int64(ps_seek_hole(source.rawValue, dataStart))
            let segmentEnd = holeStart >= 0 ? holeStart : Int64.max
            offset = dataStart
            while offset < segmentEnd {
                let wanted = Int(min(Int64(Self.chunkBytes), segmentEnd - offset))
                let count = try buffer.withUnsafeMutableBytes { buffer in
                    try FileSystem.mappingErrno(path: sourcePath, doing: "read") {
                        try source.read(fromAbsoluteOffset: offset, into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<wanted]), retryOnInterrupt: true)
                    }
                }
                if count == 0 { break }
                try buffer.withUnsafeBytes { try file.write(from: UnsafeRawBufferPointer(rebasing: $0[0..<count]), at: offset) }
                offset += Int64(count)
                end = max(end, offset)
                progress?(UInt64(offset), UInt64(max(size, offset)))
            }
            if offset < segmentEnd { break }  // the source ended early (it shrank meanwhile)
        }
        // A trailing hole: the size as it is now, with nothing stored for it.
        if fstat(source.rawValue, &info) == 0, Int64(info.st_size) > end {
            end = Int64(info.st_size)
            try file.truncate(to: end)
        }
        progress?(UInt64(end), UInt64(end))
        return UInt64(end)
    }
}
